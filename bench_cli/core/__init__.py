"""The floor every task and the CLI stand on: metrics with their direction (metrics), errors
(errors), the task contract with the evaluation context, protocols and device moves (task), the
dataset fetchers' base and registry (fetch), network checks (net), progress of long counts
(progress), a measurement's median with its spread (spread) and console output (ui). It imports neither the rest of bench_cli nor tasks, so neither can form an import
cycle through it (DESIGN.md)."""
