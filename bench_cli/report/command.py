"""`attnbench report NAME`: read the experiment's records, build its tables (bench_cli.report.spec
says which), print them and write ``<out>/<NAME>.md`` + ``.csv`` (+ ``<NAME>.<column>.csv`` per
further table). The experiment's config is composed once, for its ``report:`` settings and its
grid's axes; everything about the runs comes from record columns."""
from __future__ import annotations

import functools
import os
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from omegaconf import OmegaConf

from bench_cli import compose as C
from bench_cli import records
from bench_cli.core.errors import UserError, unknown_choice
from bench_cli.report import render, select, spec, stats
from bench_cli.report.paper import load_paper
from bench_cli.ui import mean_pm
from bench_cli.core.files import write_atomically

USAGE = """\
usage: attnbench report [NAME] [--records PATH] [--out DIR] [--all] [--width N] [overrides...]

  NAME            an experiment (attnbench ls experiments), e.g. primal_dual/table1: its runs
                  next to the paper's numbers. Without NAME: every run of the records file,
                  grouped by the columns whose values differ between rows (model, dataset,
                  overrides...), with the mean and std over seeds of each group
  --records PATH  the records file (default: results.path of the config, results/runs.csv)
  --out DIR       where NAME.md and NAME.csv go (without NAME: <records file name>.md/.csv;
                  default: reproduced/ beside the records file, i.e. results/reproduced for
                  results/runs.csv)
  --all           also list the grid's datasets that have no records (as gaps)
  --width N       print N columns wide (default: COLUMNS, else the terminal's width, else 80
                  when the output is not a terminal); a wider table prints one block per row
  --no-write      print only
  logger=wandb    also log the table to Weights & Biases (with NAME)
"""
REPORT_OPTIONS = {"--records": True, "--out": True, "--all": False, "--width": True, "--no-write": False}
# Overrides that change the schedule: the header names them (the step budget is a record column).
BUDGET_KEYS = ("trainer.max_epochs", "trainer.max_steps")


def _parse(args: list[str]):
    from bench_cli.args import parse

    p = parse("report", args, REPORT_OPTIONS)
    width = p.get("--width")
    if width is not None and not (str(width).isdigit() and int(width) > 0):
        raise UserError(f"--width {width}: expected a number of columns, e.g. --width 100")
    opts = {"records": p.get("--records"), "out": p.get("--out"), "all": bool(p.get("--all")),
            "width": int(width) if width else None, "write": not p.get("--no-write")}
    return p.positional, p.overrides, opts


def rerun_command(name: str | None, path: Path, out_dir: Path, opts: dict, overrides: list[str]) -> str:
    """The command that rewrites the report just written: its records file and output folder
    spelled out (their defaults depend on the config), then every other option and override given."""
    words = ["attnbench", "report", *([name] if name else []), "--records", str(path), "--out", str(out_dir),
             *(["--all"] if opts["all"] else []), *(["--width", str(opts["width"])] if opts["width"] else []),
             *overrides]
    return " ".join(shlex.quote(w) for w in words)


def grid_axes(cfg, *extra: str) -> dict[str, list[str]]:
    """Values of the experiment's sweep axes (task.dataset, model and the ``extra`` keys), in grid order."""
    params = OmegaConf.select(cfg, "hydra.sweeper.params", default=None)
    params = OmegaConf.to_container(params) if params is not None else {}
    out = {}
    for k in ("task.dataset", "model", *extra):
        if k in params:
            out[k] = [v.strip() for v in str(params[k]).split(",") if v.strip()]
    return out


@dataclass
class Table:
    """One table of the report: a spec column against the paper, with its cells and rows."""
    column: spec.Column
    cells: dict
    rows: list[dict]
    average: dict | None
    columns: tuple = ()       # the spec columns shown beside it


@dataclass
class Report:
    name: str
    settings: dict
    layout: spec.Layout
    rows: select.Rows
    datasets: list[str]
    records: list[dict]
    base_records: list[dict]
    path: Path
    grid_datasets: list[str] = field(default_factory=list)
    tables: list[Table] = field(default_factory=list)
    printed_average: dict = field(default_factory=dict)
    duplicates: int = 0       # ok rows of an already counted job_key (select.one_row_per_job)
    command: str = ""         # the command that rewrites this report (rerun_command)

    @property
    def baseline(self) -> str:
        return str(self.settings.get("baseline") or "softmax")

    @property
    def floor(self) -> float:
        return float(self.settings.get("tolerance_floor", 1.0))

    def paper_model(self, label: str) -> str:
        sp = self.rows.by_label.get(label)
        return dict(self.settings.get("paper_models") or {}).get(sp.model, sp.model) if sp else label

    @functools.cached_property
    def labels(self) -> list[str]:
        """The rows shown: every row label with a record (ok or not) of the experiment."""
        ran = {self.rows.label_of(r) for r in self.records}
        return [label for label in self.rows.labels if label in ran]

    @property
    def not_run(self) -> list[str]:
        """Row labels of the grid without a single record: listed once in the notes, not as gaps."""
        shown = set(self.labels)
        return [label for label in self.rows.labels if label not in shown]

    def paper_lookup(self, column: spec.Column):
        """(paper_of(dataset, label), printed averages) of a column: the paper's row of the dataset's
        and model's paper names, matching the column's filter and the row's value of every rows_by key."""
        table, averages = load_paper(self.settings, column.paper_metric, column.paper_filter)
        datasets = dict(self.settings.get("paper_datasets") or {})

        def paper_of(d: str, label: str):
            sp = self.rows.by_label.get(label)
            pairs = list(zip(self.layout.rows_by, sp.values)) if sp else []
            notes = [by.paper_notes.get(value.lower()) for by, value in pairs]
            where = {**column.paper_filter, **{by.paper_column: value for by, value in pairs if by.paper_column}}
            return table.get((str(datasets.get(d, d)).lower(), self.paper_model(label)), notes, where)
        return paper_of, averages

    def table(self, column: spec.Column, beside: tuple) -> Table:
        """The table of ``column``: cells over seeds, the comparison, and the ``beside`` columns."""
        cells = select.aggregate(self.records, column.column, self.rows.label_of)
        base_cells = select.aggregate(self.base_records, column.column, self.rows.label_of)
        paper_of, averages = self.paper_lookup(column)
        if not self.tables:
            self.printed_average = averages

        def baseline_of(d: str, label: str):
            base_label = self.rows.with_model(label, self.baseline)
            return base_cells.get((d, base_label)), base_label

        extras = [(c, self.paper_lookup(c)[0] if c.paper_metric else None) for c in beside]
        labels = self.labels
        rows = stats.build_rows(cells, self.datasets, labels, paper_of, baseline_of,
                                self.layout.paper_runs.of, self.paper_model, self.floor, extras)
        return Table(column, cells, rows, stats.average_row(cells, self.datasets, labels, paper_of, self.floor),
                     tuple(beside))

    @property
    def used(self) -> list[dict]:
        return [r for c in self.tables[0].cells.values() for r in c.rows]


def _load(names: list[str], overrides: list[str], opts: dict):
    """(name, composed config, records path, all records, the experiment's records)."""
    experiments = C.group_options("experiment")
    if len(names) != 1:
        raise UserError(f"give one experiment name; valid: {', '.join(experiments)}")
    name = names[0].removeprefix("experiment=")
    if name not in experiments:
        raise unknown_choice("experiment", name, experiments)
    C.check_group_choices(overrides)
    cfg = C.compose_unchecked([f"experiment={name}", *overrides], with_hydra=True)
    settings = cfg.get("report")
    if settings is None or not (settings.get("paper_csv") or settings.get("kind") == "zoo"):
        raise UserError(f"experiment {name} has no report settings (report.paper_csv)")
    path = Path(opts["records"] or cfg.results.path)
    all_records = records.read_records(path)
    rows = [r for r in all_records if r.get("experiment") == name]
    if not rows:
        raise UserError(f"no records of experiment {name} in {path}; run `attnbench sweep experiment={name}` first")
    return name, cfg, path, all_records, rows


def build(name: str, cfg, path: Path, all_records: list[dict], rows: list[dict], show_all: bool) -> Report:
    """Every table of the report, from the records and the experiment's ``report:`` settings."""
    settings = OmegaConf.to_container(cfg.report, resolve=True)
    layout = spec.layout(settings)
    all_records, _ = select.one_row_per_job(all_records)
    rows, duplicates = select.one_row_per_job(rows)
    keys = tuple(by.key for by in layout.rows_by)
    axes = grid_axes(cfg, *keys)
    report_rows = select.Rows(rows, axes.get("model") or [], keys, axes)
    with_records = {r["dataset"] for r in rows}
    grid_ds = axes.get("task.dataset") or []
    datasets = [d for d in grid_ds if show_all or d in with_records] + sorted(with_records - set(grid_ds))
    baseline = str(settings.get("baseline") or "softmax")
    base_source = ([r for r in all_records if r.get("experiment") == settings["baseline_experiment"]]
                   if settings.get("baseline_experiment") else rows)
    report = Report(name, settings, layout, report_rows, datasets, rows,
                    [r for r in base_source if r.get("model") == baseline], path, grid_ds, duplicates=duplicates)
    report.tables.append(report.table(layout.headline, layout.every + layout.inline))
    report.tables += [report.table(c, layout.every) for c in layout.own]
    return report


# --- the header and the notes ---------------------------------------------------------------------
def wall_clock(rows: list[dict]) -> str | None:
    """What the sweep cost on the machine that ran it: the time during which at least one run was in
    progress (the union of the runs' intervals, so a sweep resumed hours later is not charged for the
    pause), the sittings it took, and the summed run times (which count parallel runs twice)."""
    from datetime import datetime, timedelta

    spans = []
    for r in rows:
        try:
            start = datetime.fromisoformat(str(r.get("time")))
            spans.append((start, start + timedelta(seconds=float(r.get("wall_time_s") or 0))))
        except (TypeError, ValueError):
            continue
    if not spans:
        return None
    merged: list[list] = []                  # the intervals with at least one run in progress
    for s, e in sorted(spans):
        if merged and s <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], e)
        else:
            merged.append([s, e])
    busy = sum((e - s).total_seconds() for s, e in merged)
    sittings = 1 + sum((b[0] - a[1]).total_seconds() > SITTING_GAP_S for a, b in zip(merged, merged[1:]))
    total = sum((e - s).total_seconds() for s, e in spans)
    span = (max(e for _, e in spans) - min(s for s, _ in spans)).total_seconds()
    where = f"{span / 60:.1f} min from the first run's start to the last run's end"
    if sittings > 1:
        where += f", in {sittings} sittings"
    return f"{busy / 60:.1f} min with runs in progress ({where}; {total / 60:.1f} min of runs)"


# A pause longer than this between runs (nothing in progress) starts a new sitting: a rerun that
# resumed the sweep. Shorter gaps are the sweep's own planning and start-up.
SITTING_GAP_S = 600


def direction_note(rows: list[dict], settings) -> str:
    """The direction of the records' selection metric (or ``report.higher_is_better``), when known."""
    flags = {str(r.get("higher_is_better", "")).lower() for r in rows} - {""}
    higher = settings.get("higher_is_better")
    if higher is None and len(flags) == 1:
        higher = flags.pop() == "true"
    return {True: " (higher is better)", False: " (lower is better)"}.get(higher, "")


def epochs_line(report: Report) -> str:
    """The epochs run (``epochs_run``): one list, or per dataset when the datasets differ."""
    cells = report.tables[0].cells
    epochs_of = {d: sorted({e for (cd, _), c in cells.items() if cd == d for e in c.epochs}) for d in report.datasets}
    if len({tuple(es) for es in epochs_of.values() if es}) > 1:
        return "; ".join(f"{d} {'/'.join(map(str, es))}" for d, es in epochs_of.items() if es)
    return "/".join(map(str, sorted({e for es in epochs_of.values() for e in es})))


def budget_lines(report: Report, axes_keys) -> list[str]:
    """The budget the experiment states in words (``report.budget``), the step budget
    (``step_budget``) and the schedule overrides the runs share, with the epochs the records planned
    (``epochs_planned``)."""
    used = report.used
    stated = [f"budget: {report.settings['budget']}"] if report.settings.get("budget") else []
    planned = select.planned_epochs(used, report.datasets)
    planned = f"; planned epochs: {planned}" if planned else ""
    lines = [f"budget: trainer.step_budget={b}: the experiment's own trainer.max_epochs cut to at most "
             f"ceil({b} / optimiser steps per epoch) whole epochs{planned}" for b in select.step_budgets(used)]
    return stated + lines + [f"budget: {token} instead of the experiment's own{planned}"
                    for token in select.common_overrides(used, axes_keys)
                    if token.split("=", 1)[0].lstrip("+") in BUDGET_KEYS]


def header_lines(report: Report) -> list[str]:
    s, used, headline = report.settings, report.used, report.tables[0]
    protocols = sorted({r.get("protocol", "") for r in used})
    seeds = sorted({r.get("seed") for r in used}, key=lambda x: (len(str(x)), str(x)))
    per_cell = sorted({c.n for c in headline.cells.values()})
    paper_models = dict(s.get("paper_models") or {})
    every = report.layout.every
    header = [
        f"protocol: {', '.join(protocols) or '—'}" + ("  (the test set selects the epoch, as the paper's code did: optimistic)"
                                                       if "paper" in protocols else ""),
        f"seeds: {len(seeds)} ({', '.join(map(str, seeds))}); runs per cell: {'/'.join(map(str, per_cell))}"
        + f"; paper n assumed {report.layout.paper_runs}",
        f"epochs: {epochs_line(report) or '—'}; metric: {headline.column.column}{direction_note(used, s)}; "
        f"paper: results/paper/{s['paper_csv']} table(s) {', '.join(str(t) for t in s.get('paper_tables') or [])}",
        *([f"paper names: {', '.join(f'{k} = {v}' for k, v in paper_models.items())}"] if paper_models else []),
        f"efficiency: ratios to {report.baseline} on the same dataset"
        + (f" (its runs in {s['baseline_experiment']})" if s.get("baseline_experiment") else "")
        + ": " + ", ".join(c.what or c.name for c in every),
        records_line(report.path, used),
        *([f"wall clock: {span}"] if (span := wall_clock(used)) else []),
    ]
    axes_keys = ("task.dataset", "model", "seed", "experiment", *(by.key for by in report.layout.rows_by))
    return header + budget_lines(report, axes_keys) + [sweep_line(report, axes_keys)]


def records_line(path: Path, used: list[dict]) -> str:
    """The records file, with the runs used and the code and torch versions that made them."""
    commits = sorted({(r.get("git_commit", "")[:10] + (" (dirty)" if r.get("git_dirty") == "true" else "")) for r in used})
    return (f"records: {path} ({len(used)} runs; git {', '.join(commits) or '—'}; "
            f"torch {', '.join(sorted({r.get('torch_version', '') for r in used})) or '—'})")


def made_by() -> str:
    """'; made by `make ...`' when a make target ran the report (ATTNBENCH_MADE_BY, mk/reproduce.mk)."""
    return f"; made by `{os.environ['ATTNBENCH_MADE_BY']}`" if os.environ.get("ATTNBENCH_MADE_BY") else ""


def sweep_line(report: Report, axes_keys) -> str:
    """The sweep that made the records (the command typed, launcher options included) and the report's."""
    used, name = report.used, report.name
    commands = {r.get("command") for r in used} - {None, ""}
    grid_ds = report.grid_datasets
    sweep_cmd = (commands.pop() if len(commands) == 1 else
                 " ".join(["attnbench sweep", f"experiment={name}", *select.common_overrides(used, axes_keys)]
                          + ([f"task.dataset={','.join(report.datasets)}"]
                             if grid_ds and set(report.datasets) != set(grid_ds) else [])))
    return f"sweep: `{sweep_cmd}`; report: `{report.command}`" + made_by()


def inline_note(report: Report, column: spec.Column) -> str:
    what = f"ratio to {report.baseline}, " if column.ratio else ""
    filt = ", ".join(f"{k} {v}" for k, v in column.paper_filter.items())
    if column.paper_metric is None:       # a column of ours the paper does not print
        return f"{column.name}: {what}ours `{column.column}` (mean over the runs); the paper does not print it."
    return (f"{column.name}: {what}ours `{column.column}` (mean over the runs) and, in parentheses, the paper's "
            f"`{column.paper_metric}`" + (f" ({filt})" if filt else "") + ".")


def average_notes(report: Report) -> list[str]:
    """Which datasets the average rows leave out, and the rows that lack them (the average covers
    the datasets where every row shown has results)."""
    average, cells = report.tables[0].average, report.tables[0].cells
    if average is None:
        if len(report.datasets) < 2:
            return []
        complete = stats.complete_datasets(cells, report.datasets, report.labels)
        return [f"{'Only ' + complete[0] if complete else 'No dataset'} has results for every model: no average row."]
    lacking = {d: [label for label in report.labels if not stats.has_results(cells, d, label)]
               for d in report.datasets if d not in average["datasets"]}
    return [f"The average leaves out {d}: no result for "
            + ("any row" if labels == report.labels else ", ".join(labels)) + "." for d, labels in lacking.items()]


def notes(report: Report) -> list[str]:
    headline, out = report.tables[0], select.duplicates_note(report.duplicates)
    out += select.not_finite_note(headline.cells.values())
    ignored = sum(c.ignored for c in headline.cells.values())
    if ignored:
        out.append(f"{ignored} older records of other configurations of the same cells were ignored (newest variant shown).")
    printed = report.printed_average
    averages = [(label, printed[report.paper_model(label)]) for label in report.labels
                if report.paper_model(label) in printed]
    shown = ", ".join(f"{label} {mean_pm(p.mean, p.std)}" for label, p in averages)
    if shown:
        out.append(f"Paper's printed average over all its datasets (Table {report.settings['paper_tables'][0]}): {shown}.")
    out += average_notes(report)
    missing = [f"{r['dataset']}/{r['model']}" for r in headline.rows if r["n"] == 0]
    if missing:
        out.append(f"Gaps (no ok run): {', '.join(missing)}.")
    if report.not_run:
        out.append(f"Not run (no records in {report.path.name}): {', '.join(report.not_run)}.")
    no_paper = sorted({r["dataset"] for r in headline.rows if r["paper_mean"] is None})
    if no_paper:
        out.append(f"No paper number for: {', '.join(no_paper)} (not in the paper's table).")
    single = sorted({r["dataset"] for r in headline.rows if r["paper_n"] == 1 and r["paper_mean"] is not None})
    if single:
        out.append(f"No Welch test for {', '.join(single)}: the paper's number there is one run (report.paper_n), "
                   "which has no spread to test against.")
    extra = report.settings.get("notes") or []  # a mapping: an experiment drops a parent's note with `name: null`
    out += [str(n) for n in (extra.values() if hasattr(extra, "values") else extra) if n is not None]
    return out + [inline_note(report, c) for c in report.layout.inline]


# --- the command --------------------------------------------------------------------------------
def cmd_report(args: list[str]) -> None:
    from bench_cli.ui import console

    if any(a in ("-h", "--help") for a in args):
        print(USAGE)
        return
    names, overrides, opts = _parse(args)
    if not names:
        from bench_cli.report.grouped import report_records

        return report_records(overrides, opts)
    name, cfg, path, all_records, rows = _load(names, overrides, opts)
    if cfg.report.get("kind") == "zoo":  # no paper: the leaderboard of every attention (bench_cli/report/zoo.py)
        from bench_cli.report.zoo import write_zoo_report

        return write_zoo_report(name, cfg, path, rows, opts, overrides)
    # Beside the records unless --out says otherwise: results/runs.csv -> results/reproduced/.
    out_dir = Path(opts["out"] or path.parent / "reproduced")
    report = build(name, cfg, path, all_records, rows, opts["all"])
    report.command = rerun_command(name, path, out_dir, opts, overrides)
    header, title = header_lines(report), str(report.settings.get("title") or name)
    tables = [(t, render.display_rows(t.rows, t.average, report.labels, t.columns),
               render.headers(report.floor, t.columns)) for t in report.tables]
    (headline, display, cols), sections = tables[0], tables[1:]
    screen = render.sized(console, opts["width"])
    render.print_table(screen, title, header, display, notes(report), cols)
    for table, shown, section_cols in sections:
        render.print_table(screen, f"{title}: {table.column.subtitle}", [], shown, [], section_cols)
    if opts["write"]:
        write(screen, out_dir / name, report, title, header, display, cols, sections)
    if cfg.logger.get("name", "none") != "none":
        _log(cfg, name, headline.rows)


def write(console, out: Path, report: Report, title, header, display, cols, sections) -> None:
    """``<out>.md``, ``<out>.csv`` and ``<out>.<column>.csv`` per further table."""
    out.parent.mkdir(parents=True, exist_ok=True)
    replaced = committed_from_other_records(out.with_suffix(".md"), header)
    if replaced:
        render.print_lines(console, [f"note: {out.with_suffix('.md')} is committed and was made from other records "
                                     f"({replaced}); it is replaced (git diff shows the change, git checkout "
                                     "restores it)"])
    write_atomically(out.with_suffix(".md"), render.markdown(title, header, display, notes(report), cols,
                                                             [(t.column.subtitle, shown, c) for t, shown, c in sections]))
    labels, written = report.labels, [out.with_suffix(".md")]
    for i, table in enumerate(report.tables):
        written.append(out.with_suffix(".csv") if i == 0 else out.parent / f"{out.name}.{table.column.column}.csv")
        render.write_csv(written[-1], table.rows, table.average, labels, table.columns)
    render.print_lines(console, [f"wrote {', '.join(map(str, written))}"])


def committed_from_other_records(md: Path, header: list[str]) -> str | None:
    """The ``records:`` line of a report that git tracks at ``md``, when it differs from the new
    report's (another records file or other runs); None otherwise."""
    from bench_cli.records import _git

    if not md.is_file() or _git("ls-files", "--error-unmatch", str(md.resolve()), root=md.resolve().parent) is None:
        return None
    old = next((line[len("- records: "):] for line in md.read_text().splitlines() if line.startswith("- records: ")), None)
    new = next((h[len("records: "):] for h in header if h.startswith("records: ")), None)
    return old if old is not None and old != new else None


def _log(cfg, name: str, table_rows: list[dict]) -> None:
    from bench_cli.loggers import make_logger

    run_dir = Path(cfg.paths.output_dir) / "reports" / name.replace("/", "-")
    run_dir.mkdir(parents=True, exist_ok=True)
    logger = make_logger(cfg.logger, {"experiment": name, "report": OmegaConf.to_container(cfg.report)}, run_dir,
                         name=f"report-{name}", job_type="report")
    logger.log_table(f"report/{name}", [dict(r) for r in table_rows])
    logger.finish("ok")
