"""The documented entry point (pyproject's console script ``bench_cli.cli:entry``, and
``python -m bench_cli.cli`` under torchrun): the CLI itself is bench_cli/commands/cli.py."""
from bench_cli.commands.cli import entry, main  # noqa: F401

if __name__ == "__main__":
    entry()
