"""Training: the loop, one update, the loss and optimiser of the paper, validation, checkpoints, data
parallelism, fine-tuning, what the user sees while it runs, and the report of a finished run."""
