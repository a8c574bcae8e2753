"""Recording: a finished run's record, the durable results file, references and recovery."""
