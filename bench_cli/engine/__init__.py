"""One run, start to end: the run path (runner), its environment (env: processes, device, seeds,
threads, precision), the training loop (trainer), the objective, optimisers, distributed setup,
checkpoints and the measurement with its cache (measure). Imports the results layer (to write the
record), config and core; never a command (tests/test_layers.py)."""
