"""Planning: what a run will need and whether it fits, before it runs (the planner and its callers)."""
