"""What every layer above reads its settings through: Hydra composition (compose), plugins,
the catalog of registered names, command-line options (args) and whether a model preset can run a
task (taskfit). Imports core, tasks and models; nothing else of bench_cli (tests/test_layers.py)."""
