"""``python -m bench_cli.profile.overhead CONFIG.yaml`` (its documented path): the bare loop is
bench_cli/commands/profile/overhead.py."""
import sys

from bench_cli.commands.profile.overhead import bare_main

if __name__ == "__main__":
    bare_main(sys.argv[1])
