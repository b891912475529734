"""A sweep's overall progress: jobs done / failed / running / to go, with a time left estimated
from how long the finished jobs took (docs/progress.md).

The sweep process learns it from what every job writes, whichever launcher ran it and in which
process: its record (appended to ``results.path`` when it ends) and its
claim (``<results.path>.claims`` while it runs: bench_cli.results.claims). A background thread
reads them once a second (a records file only when it changed); nothing here imports torch.

On a terminal the sweep shows one live line under the jobs' own lines (a job in another process,
a joblib worker, clears that line before it prints: ``clear_live_line``); off a terminal (nohup,
Slurm, a pipe) it prints a plain line after each finished job, and every QUIET_LINE_S seconds
while none finishes.
"""
from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass

from bench_cli.core.ui import duration_text
from bench_cli.results import claims, csv_store

POLL_S = 1.0  # how often the records and claims are read
QUIET_LINE_S = 60.0  # off a terminal, a line at least this often while no job finishes


@dataclass
class Counts:
    """Where the launched jobs are: finished (ok or not), running (a live claim), to go."""
    total: int
    done: int = 0
    failed: int = 0
    running: int = 0
    eta_s: float | None = None  # None until a job has finished (no time per job to go by)

    @property
    def to_go(self) -> int:  # never negative: another process may finish more than this one counted on
        return max(0, self.total - self.done - self.failed - self.running)

    @property
    def finished(self) -> int:
        return self.done + self.failed

    def text(self, elapsed_s: float) -> str:
        """One line ('ETA ?' until a job has finished); beside the live bar on a narrow terminal,
        what is cut is its end: the time elapsed."""
        return (f"{self.done} done, {self.failed} failed, {self.running} running, {self.to_go} to go; "
                f"ETA {duration_text(self.eta_s)}, {duration_text(elapsed_s)} elapsed")


class SweepProgress:
    """``with SweepProgress(jobs, before, ttl_s):`` around a sweep's launch. ``jobs``: (job_key,
    records file) of each job launched; ``before``: records file -> its number of rows when the
    sweep started (a row after those, of a launched job, is its outcome)."""

    def __init__(self, jobs: list[tuple[str, str]], before: dict[str, int], ttl_s: float):
        from bench_cli.core.ui import console

        self.keys: dict[str, set[str]] = {}
        for key, path in jobs:
            self.keys.setdefault(path, set()).add(key)
        self.total = sum(len(k) for k in self.keys.values())
        self.before, self.ttl_s, self.console = before, ttl_s, console
        self.live = console.is_terminal
        self.outcomes: dict[str, str] = {}  # job_key -> the status of its record
        self.seen: dict[str, tuple] = {}  # records file -> its (mtime, size) when last read
        self.started = time.monotonic()
        self.stop = threading.Event()
        self.shown_finished, self.shown_at = 0, self.started
        self.bar = None  # the live line (rich) on a terminal, while the sweep runs

    def poll(self) -> Counts:
        """The counts now: the records files read again when they changed, the claims each time."""
        running = 0
        for path, keys in self.keys.items():
            stat = _stat(path)
            if stat != self.seen.get(path):
                self.seen[path] = stat
                for row in csv_store.read_records(path)[self.before.get(path, 0):]:
                    if row.get("job_key") in keys:
                        self.outcomes[row["job_key"]] = row.get("status") or "failed"
            running += sum(k not in self.outcomes for k in claims.live_claims(path, keys, self.ttl_s))
        counts = Counts(self.total, sum(s == "ok" for s in self.outcomes.values()),
                        sum(s != "ok" for s in self.outcomes.values()), running)
        if counts.finished:
            # the time per finished job as the sweep saw it (process start-up included, parallel
            # workers counted) times the jobs left; a record's wall_time_s would leave the start-up out
            counts.eta_s = (time.monotonic() - self.started) / counts.finished * (counts.running + counts.to_go)
        return counts

    def __enter__(self) -> SweepProgress:
        if self.live:
            from rich.progress import BarColumn, Progress, TextColumn

            # jobs that print in this process (the basic launcher) print above the line
            self.bar = Progress(TextColumn("[bold]sweep"), BarColumn(bar_width=10), TextColumn("{task.fields[line]}"),
                                console=self.console, transient=True, refresh_per_second=2)
            self.task = self.bar.add_task("sweep", total=self.total, line=Counts(self.total).text(0.0))
            self.bar.start()
        self.thread = threading.Thread(target=self._watch, name="attnbench-sweep-progress", daemon=True)
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join(timeout=10)
        if self.bar is not None:
            self.bar.stop()
        elif exc[0] is None:  # the last job's line, if the thread did not print it
            self._tick()

    def _watch(self) -> None:
        while not self.stop.wait(POLL_S):
            self._tick()

    def _tick(self) -> None:
        try:
            self._show(self.poll())
        except Exception:  # noqa: BLE001 - a records file another tool broke: the sweep says so at its end
            pass

    def _show(self, counts: Counts) -> None:
        now = time.monotonic()
        line = counts.text(now - self.started)
        if self.bar is not None:
            self.bar.update(self.task, completed=counts.finished, line=line)
        elif counts.finished > self.shown_finished or now - self.shown_at >= QUIET_LINE_S:
            self.shown_finished, self.shown_at = counts.finished, now
            self.console.print(f"sweep progress: {line}", highlight=False, markup=False, soft_wrap=True)


def _stat(path: str) -> tuple | None:
    try:
        st = os.stat(csv_store.target(path))
    except OSError:
        return None
    return st.st_mtime_ns, st.st_size


def clear_live_line(console) -> None:
    """In a job's own process (a joblib worker) writing to the sweep's terminal: clear the sweep's
    live line before the job's line is printed, in the same write (``with console``), so the line
    is not printed after it; the sweep draws it again below within a second."""
    from rich.control import Control
    from rich.segment import ControlType

    console.control(Control((ControlType.CARRIAGE_RETURN,), (ControlType.ERASE_IN_LINE, 2)))
