"""Terminal output: progress bars and summary tables (rich)."""
from __future__ import annotations

import math
import sys
import time
from contextlib import contextmanager
from pathlib import Path

from rich.console import Console
from rich.progress import (BarColumn, MofNCompleteColumn, Progress, ProgressColumn, TextColumn, TimeElapsedColumn,
                           TimeRemainingColumn)
from rich.table import Column, Table
from rich.text import Text

console = Console()
from bench_cli.core.progress import err_console  # noqa: E402,F401  (one stderr console)


@contextmanager
def progress_bar(enabled: bool = True):
    if not enabled:
        yield None
        return
    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), RateColumn(),
                  TimeElapsedColumn(), TimeRemainingColumn(),
                  # the status (the last evaluation) folds onto a second line rather than squeeze the counts
                  TextColumn("{task.fields[status]}", table_column=Column(no_wrap=False)),
                  # off a terminal: no 10 Hz thread, and no last frame either (transient): redirected
                  # output has a line per evaluation instead, and a frame folded to 80 columns is noise
                  console=console, transient=not console.is_terminal, auto_refresh=console.is_terminal) as p:
        yield _Progress(p)


class RateColumn(ProgressColumn):
    """The task's speed in its ``unit`` per second (``12.5 steps/s``, ``1,250 steps/s``); empty for
    a task without a unit or before rich has two samples."""

    def render(self, task) -> Text:
        unit, speed = task.fields.get("unit"), task.speed
        if not unit or not speed:
            return Text("")
        return Text(f"{speed:,.0f} {unit}/s" if speed >= 100 else f"{speed:.3g} {unit}/s", style="progress.data.speed")


class _Progress:
    """Thin adapter so the trainer needs no rich import; tasks may omit `status`."""

    COUNT_EVERY_S = 0.1  # ``count`` redraws at most this often: a training step costs a call and a clock read

    def __init__(self, p: Progress):
        self.p = p
        self.counted: dict = {}  # task -> (its total, when ``count`` last passed its value on)

    def add_task(self, description, total, status="", transient=False, unit=""):
        task = self.p.add_task(description, total=total, status=status, unit=unit)
        self.counted[task] = (total, 0.0)
        return task

    def advance(self, task_id, n=1):
        self.p.advance(task_id, n)

    def count(self, task_id, done: int) -> None:
        """The task's count, called as often as it changes (each training step): passed on to the
        bar at most every COUNT_EVERY_S seconds, and when it reaches the total."""
        now = time.monotonic()
        total, last = self.counted[task_id]
        if now - last >= self.COUNT_EVERY_S or done == total:
            self.counted[task_id] = (total, now)
            self.p.update(task_id, completed=done)

    def update(self, task_id, **kw):
        self.p.update(task_id, **kw)

    def remove_task(self, task_id):
        self.p.remove_task(task_id)


def show_table(title: str, headers: list[str], rows: list[list[str]], *, caption: str | None = None,
               row_styles: list[str | None] | None = None, out: Console | None = None) -> None:
    """A table that stays readable at any width: columns as wide as their widest cell and never
    wrapped when the table fits the console; otherwise one block per row (first column as its
    heading, then ``header: value`` lines), so names and numbers are never cut or folded.
    Cells may hold rich markup; widths are measured on the plain text."""
    out = out or console
    plain = [[Text.from_markup(c).plain for c in r] for r in rows]
    widths = [max([len(h)] + [len(r[i]) for r in plain]) for i, h in enumerate(headers)]
    needed = sum(widths) + 3 * len(widths) + 1
    styles = row_styles or [None] * len(rows)
    if needed <= out.width:
        t = Table(title=title, caption=caption, caption_justify="left")
        for h in headers:
            t.add_column(h, no_wrap=True)
        for r, style in zip(rows, styles):
            t.add_row(*r, style=style)
        out.print(t)
        return
    out.print(f"[bold]{title}[/]", soft_wrap=True)
    for r, style in zip(rows, styles):
        out.print(Text.from_markup(r[0], style=style or ""), soft_wrap=True)
        for h, c in zip(headers[1:], r[1:]):
            out.print(Text.from_markup(f"  {h}: ") + Text.from_markup(c), soft_wrap=True)
    if caption:
        out.print(caption, soft_wrap=True)


def show_groups(groups: list[tuple[str, list[list[str]]]], *, out: Console | None = None) -> None:
    """Rows under headings: each group's columns as wide as its widest cell, two spaces apart,
    indented by two. A row wider than the console moves its last cell (a path, say) to a line of
    its own below it, indented by four, so that no cell is ever cut or folded. Cells may hold rich
    markup; widths are measured on the plain text."""
    out = out or console
    for heading, rows in groups:
        out.print(heading, soft_wrap=True, highlight=False)
        plain = [[Text.from_markup(c).plain for c in r] for r in rows]
        widths = [max(len(r[i]) for r in plain) for i in range(len(plain[0]) - 1)] if plain else []
        for r, p in zip(rows, plain):
            cells = [Text.from_markup(c) + " " * (w - len(t)) for c, t, w in zip(r, p, widths)]
            line = Text("  ") + Text("  ").join(cells)
            if len(line.plain) + 2 + len(p[-1]) <= out.width:
                out.print(line + Text("  ") + Text.from_markup(r[-1]), soft_wrap=True, highlight=False)
            else:
                line.rstrip()
                out.print(line, soft_wrap=True, highlight=False)
                out.print(Text("    ") + Text.from_markup(r[-1]), soft_wrap=True, highlight=False)


def human(n, unit="") -> str:
    if n in (None, ""):
        return "-"
    n = float(n)
    for suffix in ("", "K", "M", "G", "T", "P"):
        if abs(n) < 1000:
            return f"{n:.3g}{suffix}{unit}"
        n /= 1000
    return f"{n:.3g}E{unit}"


def duration_text(seconds: float | None) -> str:
    """45 s, 12 min, 3.5 h (a claim's age, a sweep's time left)."""
    if seconds is None:
        return "?"
    if seconds >= 7200:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min"


def print_summary(row: dict, records_path: str | None = None, logged=()) -> None:
    """A finished run's record as a table, then the paths: the records file, the run folder, the
    checkpoints, and ``logged``: (what, where) the loggers wrote (bench_cli.results.loggers:
    history.csv, wandb's folder and sync command)."""
    metric = row.get("metric") or "accuracy"
    direction = {"True": "↑", "False": "↓", True: "↑", False: "↓"}.get(row.get("higher_is_better"), "")
    t = Table(title=f"attnbench run {row['run_id']}  [{row['status']}]", show_header=True)
    t.add_column("field", no_wrap=True)
    t.add_column("value", overflow="fold")
    others = [k[len("test_"):] for k in row if k.startswith("test_") and k not in
              ("test_score", "test_score_last", f"test_{metric}", f"test_{metric}_last")
              and not k.endswith("_last") and row.get(k) not in (None, "")]
    from bench_cli.core.spread import interval_text

    fields = [
        ("task / dataset", f"{row['task']} / {row['dataset']}"),
        ("model (attention)", f"{row['model']} ({row['attention']})"),
        ("seed / protocol", f"{row['seed']} / {row['protocol']}" + ("  (test set selects the epoch: optimistic)" if row["protocol"] == "paper" else "")),
        (f"test {metric} {direction}", _value(row.get("test_score"), metric)),
        (f"val {metric} (selection)", _value(row.get("val_score"), metric)),
        *[(f"test {name}", _value(row.get(f"test_{name}"), name)) for name in others],
        schedule_field(row),
        ("params (attention per layer)", f"{human(row.get('params'))} ({human(row.get('attn_params_per_layer'))})"),
        ("FLOPs/sample fwd | train step", f"{human(row.get('flops_forward'))} | {human(row.get('flops_train_step'))}"),
        ("peak mem train | infer", f"{human(row.get('peak_mem_train_bytes'), 'B')} | {human(row.get('peak_mem_infer_bytes'), 'B')}"),
        ("train time (median epoch [IQR])", f"{row.get('train_time_s', '-')} s ({interval_text(row, 'time_per_epoch_s', '{:.4g}')} s)"
         + (f"  [red]{row['timing_noisy']}[/]" if row.get("timing_noisy") else "")),
        ("device", row.get("device", "-")),
    ]
    if row.get("error"):
        fields.append(("error", row["error"]))
    for k, v in fields:
        t.add_row(k, str(v))
    console.print(t)
    # Paths below the table, never folded inside a cell, so they can be copied.
    print_path(f"record (run_id {row['run_id']})", records_path or "-")
    print_path("run folder", str(row.get("output_dir", "-")))
    if row.get("checkpoint_dir"):  # bench_cli/engine/checkpoint.py
        size = human(row.get("checkpoint_bytes") or 0, "B")
        if Path(row["checkpoint_dir"]).is_dir():
            state = size
        elif row.get("status") == "ok":  # finish() removed them
            state = f"{size}; removed, the run is ok: trainer.checkpoint.keep_final=true keeps them"
        else:
            state = "none written"
        print_path(f"checkpoints ({state})", row["checkpoint_dir"])
    for label, where in logged:  # bench_cli.results.loggers: history.csv, wandb's folder and sync command
        print_path(label, where)


def schedule_field(row: dict) -> tuple[str, str]:
    """Where the selected evaluation was and how long the fit ran, in the schedule's unit: steps
    for a step schedule (its record has ``best_step``: trainer.max_steps / eval_every_steps), else
    epochs."""
    if row.get("best_step") not in (None, ""):
        return "best step / steps run", f"{row['best_step']} / {row.get('steps_run') or '-'}"
    return "best epoch / epochs run", f"{row.get('best_epoch', '-')} / {row.get('epochs_run', '-')}"


def print_path(label: str, path: str, out: Console | None = None) -> None:
    """``label: path`` on one line, or the path on a line of its own when both do not fit the
    console: never broken inside (a terminal may wrap it for display; copying keeps it whole)."""
    out = out or console
    text = f"{label}: {path}"
    if len(text) > out.width:
        text = f"{label}:\n{path}"
    out.print(text, soft_wrap=True, highlight=False, markup=False)


def _value(v, name: str = "") -> str:
    if v in (None, ""):
        return "-"
    v = float(v)
    if "accuracy" in name:
        return f"{v:.2f} %"
    return f"{v:.4g}" if abs(v) < 100 else f"{v:.2f}"


def fail(message: str, code: int = 2):
    from rich.markup import escape  # a message is text: `pip install 'attnbench[vision]'` keeps its brackets

    err_console.print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
    sys.exit(code)


# --- value formatting: the one place reports, sweeps and summaries format numbers ----------------
DASH = "—"  # a missing value in a report (never a 0)


def wide(out: Console, width: int) -> Console:
    """``out`` itself on a terminal; a console of at least ``width`` columns on the same stream
    otherwise (a log file or a pipe gets the whole table instead of one squeezed into 80 columns)."""
    return out if out.is_terminal else Console(file=out.file, width=max(out.width, width))


def metric_digits(value: float) -> int:
    """Decimals that show a metric readably (accuracy 98.65, RMSE 0.0123)."""
    return 2 if abs(value) >= 1 else 4


def mean_pm(mean: float | None, std: float | None, digits: int | None = None) -> str:
    """mean ± std with 2 decimals, or 3 significant digits for values below 1 (an RMSE of 0.0543)."""
    if mean is None:
        return DASH
    if digits is None:
        digits = 2 if abs(mean) >= 1 or mean == 0 else 2 - math.floor(math.log10(abs(mean)))
    return f"{mean:.{digits}f}" + (f" ± {std:.{digits}f}" if std is not None else "")


def fixed(value: float | None, digits: int = 2) -> str:
    """A number with ``digits`` decimals and thousands separators (66,048), or a dash."""
    return DASH if value is None else f"{value:,.{digits}f}"


def signed(value: float | None) -> str:
    """A difference with its sign and 2 decimals (+0.22), or a dash."""
    return DASH if value is None else f"{value:+.2f}"


def csv_value(value) -> str:
    """A report CSV cell: blank for missing, true/false, whole numbers from 1000 up as integers,
    other numbers with 4 decimals."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() and abs(value) >= 1000 else f"{value:.4f}"
    return str(value)


HELP_WIDTH = 80  # a usage text's lines, as every table's, fit 80 columns


def usage_text(text: str, width: int = HELP_WIDTH) -> str:
    """A command's usage folded to ``width`` columns. A block -- a ``usage:`` line or an option
    with its description, and the lines that continue it under the same column; or a paragraph of
    unindented prose -- that has a line too long is refilled, continuing under its own text; other
    indented lines (example commands) are folded alone, continued 4 columns further in; words,
    paths and options are never cut."""
    import textwrap

    lines, out, i = text.splitlines(), [], 0
    while i < len(lines):
        if not lines[i].strip():
            out.append(lines[i])
            i += 1
            continue
        lead, hang = _indent(lines[i]), _hanging_column(lines[i], width)
        block, i = [lines[i]], i + 1
        same = hang if hang is not None else (0 if lead == 0 else None)  # the indent of a continuation
        while same is not None and i < len(lines) and lines[i].strip() and _indent(lines[i]) == same \
                and (hang is not None or _hanging_column(lines[i], width) is None):
            block.append(lines[i])
            i += 1
        if max(map(len, block)) <= width:
            out += block
            continue
        out += textwrap.wrap(" ".join(b.strip() for b in block), width, initial_indent=" " * lead,
                             subsequent_indent=" " * (hang if hang is not None else lead + 4 if lead else 0),
                             break_long_words=False, break_on_hyphens=False)
    return "\n".join(out)


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def _hanging_column(line: str, width: int) -> int | None:
    """Where a line's text column starts: after ``usage: attnbench VERB `` or after an option and the
    two or more spaces that follow it (``  --out DIR       where ...``); None for prose."""
    import re

    m = re.match(r"(usage: attnbench \S+ |\s*\S+(?: \S+)*?\s{2,})\S", line)
    return len(m.group(1)) if m and len(m.group(1)) <= width // 2 else None
