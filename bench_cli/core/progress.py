"""Progress of long counts that task families run (data generation, downloads), on stderr."""
from __future__ import annotations

import sys
import time
from contextlib import ExitStack, contextmanager

from rich.console import Console
from rich.progress import (BarColumn, DownloadColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn,
                           TimeRemainingColumn, TransferSpeedColumn)

err_console = Console(stderr=True)


def _megabytes(n: float) -> str:
    return f"{n / 1e6:.1f} MB"


@contextmanager
def count_progress(description: str, total: int, every_pct: int = 10, *, every_s: float | None = None,
                   after_s: float | None = 0.0, in_bytes: bool = False, start: int = 0):
    """``update(done, total)`` for a long count, shown on stderr: a rich bar on a terminal, else
    (nohup, Slurm, CI logs) one plain line each ``every_pct`` percent, and each ``every_s`` seconds
    when given. The bar is redrawn by the caller's updates, at most 10 times a second, not by a
    thread (the caller may fork workers). ``after_s``: nothing is shown before that many seconds
    (a count that ends sooner shows nothing); None: nothing at all. ``in_bytes``: a transfer, shown
    in MB with its speed and time remaining (``start``: the bytes there before, a resumed
    download's, which do not count in the speed)."""
    started = time.monotonic()
    if after_s is None:
        yield lambda done, total: None
        return

    def speed_eta(done: int, total: int) -> str:
        rate = (done - start) / max(time.monotonic() - started, 1e-9)
        eta = f", ETA {(total - done) / rate:.0f} s" if rate > 0 and total else ""
        return f"{_megabytes(done)}/{_megabytes(total) if total else '?'}, {_megabytes(rate)}/s{eta}"

    if not err_console.is_terminal:
        shown = [-1, started]  # the last step printed, when

        def line(done: int, total: int) -> None:
            now = time.monotonic()
            if in_bytes and not total:  # a transfer of unknown size: a line each 100 MB
                step, label = done // 10**8, ""
            else:
                step = min(100, 100 * done // max(total, 1)) // every_pct
                label = f"{step * every_pct}% "
            if now - started >= after_s and (step > shown[0] or every_s is not None and now - shown[1] >= every_s):
                shown[:] = [step, now]
                what = speed_eta(done, total) if in_bytes else f"{done}/{total}, {now - started:.0f} s"
                print(f"{description}: {label}({what})", file=sys.stderr, flush=True)

        yield line
        return
    columns = ((DownloadColumn(), TransferSpeedColumn(), TimeRemainingColumn()) if in_bytes
               else (MofNCompleteColumn(), TimeElapsedColumn(), TimeRemainingColumn()))
    with ExitStack() as stack:
        bar_of: list = []  # [Progress, its task, when drawn] once shown

        def bar(done: int, total: int) -> None:
            now = time.monotonic()
            if not bar_of:
                if now - started < after_s:
                    return
                p = stack.enter_context(Progress(TextColumn("[bold]{task.description}"), BarColumn(), *columns,
                                                 console=err_console, auto_refresh=False))
                bar_of[:] = [p, p.add_task(description, total=total or None, completed=start), 0.0]
            p, task, drawn = bar_of
            if now - drawn >= 0.1 or (total and done >= total):
                bar_of[2] = now
                p.update(task, completed=done, total=total or None, refresh=True)

        yield bar
