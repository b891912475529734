"""An `attnbench` command in a process of its own, for the tests of what only a separate process
shows (a signal to it, kill -9 of it, its exit status, the worker processes it starts). The process
is forked from the forkserver of tests/ddp_processes.py, which has imported torch, torch._dynamo,
Hydra and the engine once per test process, and calls the console script's ``entry`` as
`attnbench` does: an exec'd `attnbench` spent 3.5-4 s of CPU importing them before it did anything.
What it starts (a sweep's joblib workers: loky's fresh interpreters) are its own children, as they
are `attnbench`'s.
"""
from __future__ import annotations

import os
import signal
import sys
from pathlib import Path


def as_a_process_of_its_own(log: str, environment: dict, folder: str) -> None:
    """The forked process made what an exec'd one would be: the test's environment and working
    folder, its output into ``log`` (ddp_processes.in_the_tests_place), a session of its own (as
    ``start_new_session``: a signal to the test's process group does not reach it), Ctrl-C raising
    KeyboardInterrupt as in a terminal's foreground process (the forkserver's processes, like a
    process started in the background, had SIGINT ignored)."""
    from ddp_processes import in_the_tests_place

    in_the_tests_place(log, environment, folder)
    os.setsid()
    signal.signal(signal.SIGINT, signal.default_int_handler)


def command_main(argv: list[str], log: str, environment: dict, folder: str) -> None:
    """`attnbench <argv>`, through the console script's ``entry``."""
    as_a_process_of_its_own(log, environment, folder)
    sys.argv = ["attnbench", *argv]
    from bench_cli.cli import entry

    entry()  # raises SystemExit with the command's exit status: the process's exitcode


def code_main(code: str, argv: list[str], log: str, environment: dict, folder: str) -> None:
    """``python -c <code> <argv>``: the code run as the main module, ``sys.argv[1:]`` its arguments."""
    as_a_process_of_its_own(log, environment, folder)
    sys.argv = ["-c", *argv]
    exec(compile(code, "<string>", "exec"), {"__name__": "__main__"})


def started(target, args: tuple, log: Path, environment: dict | None):
    """The process (a ``multiprocessing`` process: ``pid``, ``join``, ``exitcode``, ``is_alive``) of
    ``target(*args, log, environment, folder)``, in ``environment`` (this process's by default) and
    this process's working folder, its output (stdout and stderr) written to ``log``."""
    from ddp_processes import preloaded_forkserver

    log.write_text("")  # there to read from the start
    environment = dict(os.environ) if environment is None else environment
    process = preloaded_forkserver().Process(target=target, args=(*args, str(log), environment, os.getcwd()))
    process.start()
    return process


def start_command(argv: list[str], log: Path, environment: dict | None = None):
    """The started `attnbench <argv>` process, its output written to ``log``."""
    return started(command_main, (argv,), log, environment)


def start_code(code: str, argv: list[str], log: Path, environment: dict | None = None):
    """The started ``python -c <code> <argv>`` process, its output written to ``log``."""
    return started(code_main, (code, argv), log, environment)


def kill_if_alive(process) -> None:
    """A started process still running (a test that failed before it ended), and its session's
    processes (a sweep's workers), killed and reaped."""
    if process.is_alive():
        os.killpg(process.pid, signal.SIGKILL)
        process.join()
