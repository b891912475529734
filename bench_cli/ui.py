"""Terminal output: progress bars and summary tables (rich)."""
from __future__ import annotations

import sys
from contextlib import contextmanager

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

console = Console()
err_console = Console(stderr=True)


@contextmanager
def progress_bar(enabled: bool = True):
    if not enabled:
        yield None
        return
    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), TimeRemainingColumn(), TextColumn("{task.fields[status]}"),
                  console=console, transient=False) as p:
        yield _Progress(p)


class _Progress:
    """Thin adapter so the trainer needs no rich import; tasks may omit `status`."""

    def __init__(self, p: Progress):
        self.p = p

    def add_task(self, description, total, status="", transient=False):
        return self.p.add_task(description, total=total, status=status)

    def advance(self, task_id, n=1):
        self.p.advance(task_id, n)

    def update(self, task_id, **kw):
        self.p.update(task_id, **kw)

    def remove_task(self, task_id):
        self.p.remove_task(task_id)


def human(n, unit="") -> str:
    if n in (None, ""):
        return "-"
    n = float(n)
    for suffix in ("", "K", "M", "G", "T", "P"):
        if abs(n) < 1000:
            return f"{n:.3g}{suffix}{unit}"
        n /= 1000
    return f"{n:.3g}E{unit}"


def print_summary(row: dict) -> None:
    t = Table(title=f"attnbench run {row['run_id']}  [{row['status']}]", show_header=True)
    t.add_column("field")
    t.add_column("value", overflow="fold")
    fields = [
        ("task / dataset", f"{row['task']} / {row['dataset']}"),
        ("model (attention)", f"{row['model']} ({row['attention']})"),
        ("seed / protocol", f"{row['seed']} / {row['protocol']}" + ("  (test set selects the epoch: optimistic)" if row["protocol"] == "paper" else "")),
        ("test accuracy", _pct(row.get("test_accuracy"))),
        ("val accuracy (selection)", _pct(row.get("val_accuracy"))),
        ("best epoch / epochs run", f"{row.get('best_epoch', '-')} / {row.get('epochs_run', '-')}"),
        ("params (attention per layer)", f"{human(row.get('params'))} ({human(row.get('attn_params_per_layer'))})"),
        ("FLOPs/sample fwd | train step", f"{human(row.get('flops_forward'))} | {human(row.get('flops_train_step'))}"),
        ("peak mem train | infer", f"{human(row.get('peak_mem_train_bytes'), 'B')} | {human(row.get('peak_mem_infer_bytes'), 'B')}"),
        ("train time (per epoch)", f"{row.get('train_time_s', '-')} s ({row.get('time_per_epoch_s', '-')} s)"),
        ("device", row.get("device", "-")),
        ("record", f"{row.get('config_path', '')}"),
    ]
    if row.get("error"):
        fields.append(("error", row["error"]))
    for k, v in fields:
        t.add_row(k, str(v))
    console.print(t)


def _pct(v) -> str:
    return "-" if v in (None, "") else f"{float(v):.2f} %"


def fail(message: str, code: int = 2):
    err_console.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
    sys.exit(code)
