"""An interrupted suite stops all of its processes.

`make test` runs a pytest-xdist controller and one worker process per core. GNU make, killed by
SIGTERM (a CI timeout, `kill`), passes the signal to the controller alone, which died at once and
left its workers running their tests, reparented to init (they exited only when execnet noticed
the lost connection, or not at all while a test held them). Loaded by tests/conftest.py:

- the controller, on SIGTERM, stops the processes the tests started, sends its workers SIGINT and
  itself KeyboardInterrupt, pytest's own interruption (the summary of what ran is printed and
  xdist tears its workers down, killing those that do not exit);
- each worker watches its controller and, once it is gone (SIGKILL, or a teardown that did not
  reach the worker), stops the processes it started and exits.
"""
from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

WATCH_INTERVAL_S = 0.5


def install(config) -> None:
    """Called from conftest's pytest_configure."""
    if hasattr(config, "workerinput"):
        die_with_controller(os.getppid())
    elif bool(getattr(config.option, "numprocesses", None)) and threading.current_thread() is threading.main_thread():
        # only in a controller: with -n 0 the tests run in this process and some send it signals
        signal.signal(signal.SIGTERM, _interrupt)


def _interrupt(signum, frame) -> None:
    """What Ctrl-C does to the whole process group, and more: SIGTERM to the processes the tests
    started (an `attnbench` run records itself as interrupted), SIGINT to every worker
    (KeyboardInterrupt in its test) and KeyboardInterrupt here. The tests' processes are stopped
    here because a worker whose test does not yield to KeyboardInterrupt is killed by xdist's
    teardown, with no chance to stop them itself."""
    workers = children(os.getpid())
    stop([pid for worker in workers for pid in children(worker)], signal.SIGTERM)
    stop(workers, signal.SIGINT)
    raise KeyboardInterrupt(f"{signal.Signals(signum).name}: the test run was asked to stop")


def stop(pids: list[int], signum: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, signum)
        except OSError:  # gone already
            pass


def die_with_controller(controller: int) -> None:
    """In a worker: once the process that started it is gone, stop the processes this worker
    started (SIGTERM: an `attnbench` run records itself as interrupted) and exit."""
    def watch():
        while os.getppid() == controller:
            time.sleep(WATCH_INTERVAL_S)
        stop(children(os.getpid()), signal.SIGTERM)
        os._exit(1)

    threading.Thread(target=watch, name="die-with-controller", daemon=True).start()


def children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (Linux /proc; none found elsewhere)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()  # after the command's name: state, ppid, ...
        except (OSError, IndexError):
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found
