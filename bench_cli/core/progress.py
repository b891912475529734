"""Progress of long counts that task families run (data generation, downloads), on stderr."""
from __future__ import annotations

import sys
import time
from contextlib import ExitStack, contextmanager

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

err_console = Console(stderr=True)


@contextmanager
def count_progress(description: str, total: int, every_pct: int = 10, *, every_s: float | None = None,
                   after_s: float | None = 0.0):
    """``update(done, total)`` for a long count, shown on stderr: a rich bar on a terminal, else
    (nohup, Slurm, CI logs) one plain line each ``every_pct`` percent, and each ``every_s`` seconds
    when given. The bar is redrawn by the caller's updates, at most 10 times a second, not by a
    thread (the caller may fork workers). ``after_s``: nothing is shown before that many seconds
    (a count that ends sooner shows nothing); None: nothing at all."""
    started = time.monotonic()
    if after_s is None:
        yield lambda done, total: None
        return
    if not err_console.is_terminal:
        shown = [-1, started]  # the last percent step printed, when

        def line(done: int, total: int) -> None:
            now = time.monotonic()
            step = min(100, 100 * done // max(total, 1)) // every_pct
            if now - started >= after_s and (step > shown[0] or every_s is not None and now - shown[1] >= every_s):
                shown[:] = [step, now]
                print(f"{description}: {step * every_pct}% ({done}/{total}, {now - started:.0f} s)",
                      file=sys.stderr, flush=True)

        yield line
        return
    with ExitStack() as stack:
        bar_of: list = []  # [Progress, its task, when drawn] once shown

        def bar(done: int, total: int) -> None:
            now = time.monotonic()
            if not bar_of:
                if now - started < after_s:
                    return
                p = stack.enter_context(Progress(
                    TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    TimeRemainingColumn(), console=err_console, auto_refresh=False))
                bar_of[:] = [p, p.add_task(description, total=total), 0.0]
            p, task, drawn = bar_of
            if now - drawn >= 0.1 or done >= total:
                bar_of[2] = now
                p.update(task, completed=done, total=total, refresh=True)

        yield bar
