"""The node: what this machine has (GPUs, driver, CPU speed, peaks, links), described once."""
