"""A signal to a sweep's own process stops the jobs it runs in other processes of this host as
it stops a single run: each job writes a checkpoint and records itself ``interrupted`` with the
signal, and the sweep's summary then lists them so. Without this, a SIGTERM to a joblib sweep
went to the sweep alone; joblib, unwinding, killed its worker processes, and their jobs were left
"missing: no record" with stale claims.

While the sweep launches (``stopping_jobs_with_the_sweep``), a termination signal to it is handed
to every job process it started that holds a claim of one of its jobs, and the sweep waits for
those claims to be released (each job releases its claim once its record is written) before it
stops itself. Ctrl-C (SIGINT) is not handed on: the terminal sends it to the jobs too; the sweep
only waits. A second signal stops the sweep at once. The jobs not yet started see the sweep
stopping (``stopping``) and do not start.
"""
from __future__ import annotations

import contextlib
import os
import signal
import tempfile
import threading
import time
from pathlib import Path

from bench_cli.core.errors import TERMINATION_SIGNALS, Interrupted
from bench_cli.core.processes import process_parent, process_start, this_host
from bench_cli.results import claims

STOP_WAIT_S = 120.0  # a job stops at its next optimiser step, then writes its checkpoint and record
POLL_S = 0.2


def _marker(sweep_pid: int) -> Path:
    """The file that says the sweep is stopping, named by its pid and start time: a later process
    that reuses the pid is not taken for it."""
    return Path(tempfile.gettempdir()) / f"attnbench-sweep-{sweep_pid}-{process_start(sweep_pid) or ''}.stopping"


def stopping(sweep_pid: int) -> bool:
    """In a job process: the sweep that launched it is stopping (the job should not start)."""
    return bool(sweep_pid) and _marker(sweep_pid).exists()


def running_job_processes(paths, keys, ttl_s: float) -> dict[str, int]:
    """job_key -> pid of the processes this sweep started that hold a claim of one of its jobs."""
    me, host = os.getpid(), this_host()
    found = {}
    for path in paths:
        for key, claim in claims.live_claims(path, keys, ttl_s).items():
            pid = int(claim.get("pid") or 0)
            if claim.get("host") == host and pid != me and process_parent(pid) == me:
                found[key] = pid
    return found


@contextlib.contextmanager
def stopping_jobs_with_the_sweep(paths, keys, ttl_s: float, say):
    """Around the launch of a sweep's jobs (see the module's docstring); ``say(text)`` prints."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    sweep_pid = os.getpid()
    marker, handed = _marker(sweep_pid), {}
    signums = [getattr(signal, n) for n in (*TERMINATION_SIGNALS, "SIGINT") if hasattr(signal, n)]
    before = {signum: signal.getsignal(signum) for signum in signums}

    def handler(signum, frame):
        if os.getpid() != sweep_pid:
            # a process forked while the sweep launched (the data loader workers of a job run in the
            # sweep's own process) inherits this handler but is not the sweep: were it to mark the
            # sweep stopping (a worker terminated after the sweep ended), every later sweep of that
            # process would take its jobs for "not started". It takes the signal as it would have.
            signal.signal(signum, before[signum])
            signal.raise_signal(signum)
            return
        if marker.exists():  # a second signal: at once
            raise Interrupted(signum)
        marker.touch()
        running = running_job_processes(paths, keys, ttl_s)
        if running:
            say(f"{signal.Signals(signum).name}: stopping the {len(running)} running job(s) at their next step, "
                "each recorded as interrupted with its checkpoint (another signal stops the sweep at once)")
        deadline = time.monotonic() + STOP_WAIT_S
        while running and time.monotonic() < deadline:
            for key, pid in running.items():
                if signum != signal.SIGINT and handed.get(key) != pid:  # Ctrl-C reached the jobs from the terminal
                    with contextlib.suppress(OSError):
                        os.kill(pid, signum)
                    handed[key] = pid
            time.sleep(POLL_S)
            running = running_job_processes(paths, keys, ttl_s)
        previous = before[signum]
        if callable(previous):  # catch_termination's (raises, or defers to a job running in this process), Ctrl-C's
            previous(signum, frame)
        elif previous != signal.SIG_IGN:
            raise Interrupted(signum)

    for signum in signums:
        signal.signal(signum, handler)
    try:
        yield
    finally:
        for signum, previous in before.items():
            signal.signal(signum, previous)
        marker.unlink(missing_ok=True)
