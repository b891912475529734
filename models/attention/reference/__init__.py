"""The reference codes of the nine efficient-attention baselines, transcribed: what the code behind
each published number computes, written as that code writes it (its layout, its einsums, its
loops), taking the weights from one of our modules. The tests compare our modules with them in
float64 (tests/test_attention_<name>.py); `attnbench bench --against-reference` times them in
float32 against our modules on the same weights (bench_cli/commands/bench_reference.py). Nothing here is
registered or used by a model."""
