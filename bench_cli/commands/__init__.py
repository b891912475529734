"""The command front-ends, one module per CLI verb (cli.py dispatches): parse the arguments, call the
engine or the results layer, print. Above everything else in bench_cli (tests/test_layers.py)."""
