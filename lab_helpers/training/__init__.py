"""Training: what runs inside the training process (litgpt's wrapper, its report, the measures)."""
