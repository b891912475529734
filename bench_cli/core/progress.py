"""Progress of long counts that task families run (data generation, downloads), on stderr."""
from __future__ import annotations

import sys
import time
from contextlib import contextmanager

from rich.console import Console
from rich.progress import (BarColumn, DownloadColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn,
                           TimeRemainingColumn, TransferSpeedColumn)

err_console = Console(stderr=True)


def _megabytes(n: float) -> str:
    return f"{n / 1e6:.1f} MB"


@contextmanager
def count_progress(description: str, total: int, every_pct: int = 10, *, in_bytes: bool = False, start: int = 0):
    """``update(done, total)`` for a long count, shown on stderr: a rich bar on a terminal, else
    (nohup, Slurm, CI logs) one plain line each ``every_pct`` percent. The bar is redrawn by the
    caller's updates, at most 10 times a second, not by a thread (the caller may fork workers).
    ``in_bytes``: a transfer, shown in MB with its speed and time remaining (``start``: the bytes
    there before, a resumed download's, which do not count in the speed)."""
    started = time.monotonic()

    def speed_eta(done: int, total: int) -> str:
        rate = (done - start) / max(time.monotonic() - started, 1e-9)
        eta = f", ETA {(total - done) / rate:.0f} s" if rate > 0 and total else ""
        return f"{_megabytes(done)}/{_megabytes(total) if total else '?'}, {_megabytes(rate)}/s{eta}"

    if not err_console.is_terminal:
        shown = [-1]

        def line(done: int, total: int) -> None:
            if in_bytes and not total:  # a transfer of unknown size: a line each 100 MB
                step, label = done // 10**8, ""
            else:
                step = min(100, 100 * done // max(total, 1)) // every_pct
                label = f"{step * every_pct}% "
            if step > shown[0]:
                shown[0] = step
                what = speed_eta(done, total) if in_bytes else f"{done}/{total}, {time.monotonic() - started:.0f} s"
                print(f"{description}: {label}({what})", file=sys.stderr, flush=True)

        yield line
        return
    columns = ((DownloadColumn(), TransferSpeedColumn(), TimeRemainingColumn()) if in_bytes
               else (MofNCompleteColumn(), TimeElapsedColumn(), TimeRemainingColumn()))
    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), *columns, console=err_console,
                  auto_refresh=False) as p:
        task = p.add_task(description, total=total or None, completed=start)
        drawn = [0.0]

        def bar(done: int, total: int) -> None:
            now = time.monotonic()
            if now - drawn[0] >= 0.1 or (total and done >= total):
                drawn[0] = now
                p.update(task, completed=done, total=total or None, refresh=True)

        yield bar
