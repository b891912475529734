"""What runs leave behind: the record schema (the only place that names record columns), records
and job claims, reports, plots and loggers. Imports config and core; never the engine nor a command
(tests/test_layers.py)."""
