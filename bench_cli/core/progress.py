"""Progress of long counts that task families run (data generation, downloads), on stderr."""
from __future__ import annotations

import sys
import time
from contextlib import contextmanager

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

err_console = Console(stderr=True)


@contextmanager
def count_progress(description: str, total: int, every_pct: int = 10):
    """``update(done, total)`` for a long count, shown on stderr: a rich bar on a terminal, else
    (nohup, Slurm, CI logs) one plain line each ``every_pct`` percent. The bar is redrawn by the
    caller's updates, at most 10 times a second, not by a thread (the caller may fork workers)."""
    started = time.monotonic()
    if not err_console.is_terminal:
        shown = [-1]

        def line(done: int, total: int) -> None:
            step = min(100, 100 * done // max(total, 1)) // every_pct
            if step > shown[0]:
                shown[0] = step
                print(f"{description}: {step * every_pct}% ({done}/{total}, {time.monotonic() - started:.0f} s)",
                      file=sys.stderr, flush=True)

        yield line
        return
    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  TimeRemainingColumn(), console=err_console, auto_refresh=False) as p:
        task = p.add_task(description, total=total)
        drawn = [0.0]

        def bar(done: int, total: int) -> None:
            now = time.monotonic()
            if now - drawn[0] >= 0.1 or done >= total:
                drawn[0] = now
                p.update(task, completed=done, total=total, refresh=True)

        yield bar
