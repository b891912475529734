"""Whether a process of this host still runs: the one check behind job claims (which process runs
a job of a records file) and run folders (`attnbench ls runs`: running or killed)."""
from __future__ import annotations

import os
import socket


def this_host() -> str:
    return socket.gethostname()


def _stat_field(pid: int | str, index: int) -> str | None:
    """Field ``index`` of /proc/PID/stat counted after the command name (which may hold spaces);
    None where there is no /proc or no such process."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[index]
    except (OSError, IndexError):
        return None


def process_start(pid: int | str = "self") -> str | None:
    """The start time of process ``pid`` in clock ticks since boot (/proc/PID/stat field 22; None
    where there is no /proc): with the pid it names one process, even after the pid is reused."""
    return _stat_field(pid, 19)


def process_parent(pid: int | str) -> int | None:
    """The parent's pid of process ``pid`` (/proc/PID/stat field 4), or None."""
    parent = _stat_field(pid, 1)
    return int(parent) if parent is not None else None


def process_alive(pid, started: str | None = None) -> bool:
    """Whether process ``pid`` of this host runs (another user's process counts); with ``started``
    (its :func:`process_start` when it was seen) only that very process, not a later one that
    reused its pid. A pid that is not a positive number is no process (``kill(-1, 0)`` or
    ``kill(0, 0)`` would ask about many)."""
    try:
        pid = int(pid)
        if pid <= 0:
            return False
        os.kill(pid, 0)
    except (TypeError, ValueError, OverflowError, ProcessLookupError):
        return False
    except PermissionError:  # exists, another user's
        pass
    except OSError:
        return False
    return started is None or process_start(pid) == started
