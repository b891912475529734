"""An `attnbench sweep` in a process of its own, for the tests of what only a separate sweep process
shows (a signal to it, kill -9 of it, the worker processes it starts). The process is forked from
the forkserver of tests/ddp_processes.py, which has imported torch, torch._dynamo, Hydra and the
engine once per test process, and calls the console script's ``entry`` as `attnbench sweep`
does: an exec'd `attnbench` spent 3.5-4 s of CPU importing them before it planned anything. Its
joblib workers are started by it as they would be by `attnbench` (loky's fresh interpreters, its
children), which is what those tests watch.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path


def sweep_main(args: list[str], log: str, environment: dict, folder: str) -> None:
    """The sweep process: the test's environment and working folder (the forkserver keeps those of
    the test that started it), a session of its own (as ``start_new_session``: a signal to the
    test's process group does not reach it), its output into ``log``."""
    os.environ.clear()
    os.environ.update(environment)
    os.chdir(folder)
    os.setsid()
    with open(log, "w") as f:
        os.dup2(f.fileno(), 1)
        os.dup2(f.fileno(), 2)
    sys.stdout, sys.stderr = open(1, "w", closefd=False), open(2, "w", closefd=False)
    sys.argv = ["attnbench", "sweep", *args]
    from bench_cli.cli import entry

    entry()  # raises SystemExit with the command's exit status: the process's exitcode


def start_sweep(args: list[str], log: Path):
    """The started sweep process (a ``multiprocessing`` process: ``pid``, ``join``, ``exitcode``),
    its output (stdout and stderr) written to ``log``."""
    from ddp_processes import preloaded_forkserver

    log.write_text("")  # there to read from the start
    process = preloaded_forkserver().Process(target=sweep_main, args=(args, str(log), dict(os.environ), os.getcwd()))
    process.start()
    return process
