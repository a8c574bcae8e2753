"""Configuration: experiments, recipes, the record schema, paths, secrets: read by every layer above."""
