"""The report of an experiment (`attnbench report NAME`, parsed in bench_cli/commands/report.py):
read its records, build its tables (bench_cli.results.report.spec says which), print them and write ``<out>/<NAME>.md`` + ``.csv`` (+ ``<NAME>.<column>.csv`` per
further table). The experiment's config is composed once, for its ``report:`` settings and its
grid's axes; everything about the runs comes from record columns."""
from __future__ import annotations

import functools
from dataclasses import dataclass, field
from pathlib import Path

from omegaconf import OmegaConf

from bench_cli.config import compose
from bench_cli.results import code_identity, csv_store
from bench_cli.results.job_records import one_row_per_job
from bench_cli.results.provenance import PROJECT_ROOT
from bench_cli.core.errors import UserError, unknown_choice
from bench_cli.core.spread import NOISY_NOTE
from bench_cli.results.report import latex, render, select, spec, stats
from bench_cli.results.report.common import commands_text, direction_note, higher_is_better, made_by, records_line, rerun_command, wall_clock
from bench_cli.results.report.paper import load_paper
from bench_cli.core.ui import mean_pm
from bench_cli.core.files import write_atomically

# Overrides that change the schedule: the header names them (the step budget is a record column).
BUDGET_KEYS = ("trainer.max_epochs", "trainer.max_steps")


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
    duplicates: int = 0       # ok rows of an already counted job_key (job_records.one_row_per_job)
    command: str = ""         # the command that rewrites this report (rerun_command)
    committed: list[dict] = field(default_factory=list)   # the committed reproduction's runs, to compare with
    formats: tuple = ("markdown", "csv")                   # what `write` writes (--format)

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
        committed = select.aggregate(self.committed, column.column, self.rows.label_of) if self.committed else None
        rows = stats.build_rows(cells, self.datasets, labels, paper_of, baseline_of,
                                self.layout.paper_runs.of, self.paper_model, self.floor, extras, committed)
        return Table(column, cells, rows, stats.average_row(cells, self.datasets, labels, paper_of, self.floor),
                     tuple(beside))

    @property
    def used(self) -> list[dict]:
        return [r for c in self.tables[0].cells.values() for r in c.rows]


# Where records are when the command is not told (--records): relative to the project, never to the
# working folder. The user's own runs (make reproduce-* writes them untracked into results/local) and
# the maintainers' committed reproduction (results/reproduced, tracked by git).
LOCAL = PROJECT_ROOT / "results" / "local"
COMMITTED = PROJECT_ROOT / "results" / "reproduced"


def committed_records(name: str) -> Path:
    return COMMITTED / f"{name}.records.csv"


def _existing(path: str | None, option: str) -> Path | None:
    if path is not None and not Path(path).is_file():
        raise UserError(f"{option} {path}: no such file")
    return Path(path) if path is not None else None


def _of(name: str, path: Path) -> list[dict]:
    return [r for r in csv_store.read_records(path) if r.get("experiment") == name]


@dataclass
class Sources:
    """The records a report reads: ``paths`` (the runs reported, in ``rows``; ``all_records`` is
    every row of those files) and the committed reproduction to compare them with (``committed``:
    its rows, empty when there is none to compare, e.g. when the runs reported are the committed ones)."""
    paths: list[Path]
    all_records: list[dict]
    rows: list[dict]
    committed_path: Path | None = None
    committed: list[dict] = field(default_factory=list)
    found: bool = False          # True: found by the command itself (no --records)
    counts: list[int] = field(default_factory=list)   # runs of the experiment per path

    def lines(self, name: str) -> list[str]:
        """Which files were read (a report never reads a file silently)."""
        read = [f"read {p} ({n} runs of {name})" for p, n in zip(self.paths, self.counts)]
        if self.committed_path:
            read.append(f"read {self.committed_path} ({len(self.committed)} runs of {name}: "
                        "the committed reproduction)")
        return read


def find_records(name: str, cfg, opts: dict) -> Sources:
    """The records of experiment ``name``. With --records: that file (and --committed, if given).
    Without: the user's own (results/local/<name>.records.csv and the config's results.path, from
    the working folder and from the project), compared with the committed reproduction
    (results/reproduced/<name>.records.csv); only the committed one when the user has none."""
    given, committed_given = _existing(opts["records"], "--records"), _existing(opts.get("committed"), "--committed")
    if given is not None:
        rows = _of(name, given)
        if not rows:
            raise UserError(f"no records of experiment {name} in {given}; "
                            f"run `attnbench sweep experiment={name}` first")
        committed = _of(name, committed_given) if committed_given else []
        return Sources([given], csv_store.read_records(given), rows, committed_given, committed, counts=[len(rows)])
    candidates = [LOCAL / f"{name}.records.csv", Path(cfg.results.path), PROJECT_ROOT / cfg.results.path]
    mine, seen = [], set()
    for path in candidates:
        if path.is_file() and path.resolve() not in seen and path.resolve() != committed_records(name).resolve():
            seen.add(path.resolve())
            if _of(name, path):
                mine.append(path)
    committed = committed_given or (committed_records(name) if committed_records(name).is_file() else None)
    if mine:
        every = [r for p in mine for r in csv_store.read_records(p)]
        counts = [len(_of(name, p)) for p in mine]
        return Sources(mine, every, [r for r in every if r.get("experiment") == name], committed,
                       _of(name, committed) if committed else [], found=True, counts=counts)
    if committed and _of(name, committed):
        rows = _of(name, committed)
        return Sources([committed], csv_store.read_records(committed), rows, found=True, counts=[len(rows)])
    looked = ", ".join(str(p) for p in dict.fromkeys([*candidates, committed_records(name)]))
    raise UserError(f"no records of experiment {name} (looked in {looked}); "
                    f"run `attnbench sweep experiment={name}` or `make reproduce-...` first")


def _load(names: list[str], overrides: list[str], opts: dict):
    """(name, composed config, the records read)."""
    experiments = compose.group_options("experiment")
    if len(names) != 1:
        raise UserError(f"give one experiment name; valid: {', '.join(experiments)}")
    name = names[0].removeprefix("experiment=")
    if name not in experiments:
        raise unknown_choice("experiment", name, experiments)
    compose.check_group_choices(overrides)
    cfg = compose.compose_unchecked([f"experiment={name}", *overrides], with_hydra=True)
    settings = cfg.get("report")
    if settings is None or not (settings.get("paper_csv") or settings.get("kind") in ("zoo", "study")):
        raise UserError(f"experiment {name} has no report settings (report.paper_csv)")
    return name, cfg, find_records(name, cfg, opts)


def build(name: str, cfg, path: Path, all_records: list[dict], rows: list[dict], show_all: bool,
          committed: list[dict] = ()) -> Report:
    """Every table of the report, from the records and the experiment's ``report:`` settings;
    ``committed``: the committed reproduction's records, compared with cell by cell."""
    settings = OmegaConf.to_container(cfg.report, resolve=True)
    layout = spec.layout(settings)
    all_records, _ = one_row_per_job(all_records)
    rows, duplicates = one_row_per_job(rows)
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
                    [r for r in base_source if r.get("model") == baseline], path, grid_ds, duplicates=duplicates,
                    committed=one_row_per_job(list(committed))[0])
    report.tables.append(report.table(layout.headline, layout.every + layout.inline))
    report.tables += [report.table(c, layout.every) for c in layout.own]
    return report


# --- the header and the notes ---------------------------------------------------------------------
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


def sweep_line(report: Report, axes_keys) -> str:
    """The sweep that made the records (the command typed, launcher options included) and the report's."""
    used, name = report.used, report.name
    grid_ds = report.grid_datasets
    fallback = " ".join(["attnbench sweep", f"experiment={name}", *select.common_overrides(used, axes_keys)]
                        + ([f"task.dataset={','.join(report.datasets)}"]
                           if grid_ds and set(report.datasets) != set(grid_ds) else []))
    return f"sweep: {commands_text(used, fallback)}; report: `{report.command}`" + made_by()


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
    out.append(f"Three questions, kept apart: the paper's interval (|Δ| ≤ max(2σ, {report.floor:g}): within or "
               "OUTSIDE); Welch's test of the two means (differs when p < 0.05, else no evidence of a difference: "
               "absence of evidence, not a match); the equivalence test (TOST, two one-sided Welch tests with the "
               "same margin max(2σ, floor)): matches only when p < 0.05.")
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
    noisy = sum(v for r in headline.rows for k, v in r.items() if k.endswith("_noisy") and v)
    if noisy:
        out.append(f"{NOISY_NOTE}: times marked noisy come from runs timed while the load exceeded the cores or "
                   f"whose epochs' times spread widely ({noisy} run(s), record column timing_noisy).")
    extra = report.settings.get("notes") or []  # a mapping: an experiment drops a parent's note with `name: null`
    out += [str(n) for n in (extra.values() if hasattr(extra, "values") else extra) if n is not None]
    return out + [inline_note(report, c) for c in report.layout.inline]


# --- the report of an experiment ------------------------------------------------------------------
def report_experiment(names: list[str], overrides: list[str], opts: dict) -> None:
    """`attnbench report NAME` (bench_cli/commands/report.py parses it): the experiment's records
    found, its tables printed and written in ``opts["formats"]``; a zoo's leaderboard or a search's
    best trials for those kinds of experiment."""
    from bench_cli.core.ui import console

    name, cfg, sources = _load(names, overrides, opts)
    path, screen = sources.paths[0], render.sized(console, opts["width"])
    render.print_lines(screen, sources.lines(name))
    if cfg.report.get("kind") == "zoo":  # no paper: the leaderboard of every attention (bench_cli/results/report/zoo.py)
        from bench_cli.results.report.zoo import write_zoo_report

        if opts["format"]:
            raise UserError(f"--format: {name} writes its own Markdown and plots; --format is for a paper's table")
        return write_zoo_report(name, cfg, path, sources.rows, opts, overrides)
    # Beside the records unless --out says otherwise: results/runs.csv -> results/reproduced/; records
    # the command found itself: the user's untracked results/local/.
    out_dir = Path(opts["out"] or (LOCAL if sources.found else path.parent / "reproduced"))
    if cfg.report.get("kind") == "study":  # no paper: the best trial of each study (bench_cli/results/report/trials.py)
        from bench_cli.results.report.trials import write_study_report

        return write_study_report(name, cfg, path, sources.rows, opts, overrides, out_dir, found=sources.found)
    report = build(name, cfg, path, sources.all_records, sources.rows, opts["all"], sources.committed)
    render.print_lines(screen, code_identity.refuse_mixed(report.tables[0].cells.values(), opts.get("mixed_code", False)))
    report.command = rerun_command(name, None if sources.found else path, out_dir, opts, overrides)
    report.formats = tuple(opts["formats"])
    header, title = header_lines(report), str(report.settings.get("title") or name)
    if len(sources.paths) > 1:
        header = [f"records: {', '.join(map(str, sources.paths))}" if h.startswith("records: ") else h for h in header]
    if report.committed:
        header.insert(header.index(next(h for h in header if h.startswith("records: "))) + 1,
                      f"committed: {sources.committed_path} ({len(report.committed)} runs): the committed reproduction "
                      "beside yours, each cell tested against it (Welch)")
    committed = bool(report.committed)
    tables = [(t, render.display_rows(t.rows, t.average, report.labels, t.columns, committed),
               render.headers(report.floor, t.columns, committed)) for t in report.tables]
    (headline, display, cols), sections = tables[0], tables[1:]
    render.print_table(screen, title, header, display, notes(report), cols)
    for table, shown, section_cols in sections:
        render.print_table(screen, f"{title}: {table.column.subtitle}", [], shown, [], section_cols)
    if opts["write"]:
        write(screen, out_dir / name, report, title, header, display, cols, sections)
    if cfg.logger.get("name", "none") != "none":
        _log(cfg, name, headline.rows)


def write(console, out: Path, report: Report, title, header, display, cols, sections) -> None:
    """The formats asked for (``--format``): ``<out>.md``; ``<out>.csv`` and ``<out>.<column>.csv``
    per further table; ``<out>.tex``."""
    formats, written = report.formats, []
    out.parent.mkdir(parents=True, exist_ok=True)
    if "markdown" in formats:
        replaced = committed_from_other_records(out.with_suffix(".md"), header)
        if replaced:
            render.print_lines(console, [f"note: {out.with_suffix('.md')} is committed and was made from other records "
                                         f"({replaced}); it is replaced (git diff shows the change, git checkout "
                                         "restores it)"])
        written.append(out.with_suffix(".md"))
        write_atomically(written[-1], render.markdown(title, header, display, notes(report), cols,
                                                      [(t.column.subtitle, shown, c) for t, shown, c in sections]))
    for i, table in enumerate(report.tables if "csv" in formats else []):
        written.append(out.with_suffix(".csv") if i == 0 else out.parent / f"{out.name}.{table.column.column}.csv")
        render.write_csv(written[-1], table.rows, table.average, report.labels, table.columns, bool(report.committed))
    if "latex" in formats:
        headline = report.tables[0]
        written.append(out.with_suffix(".tex"))
        write_atomically(written[-1], latex.table(
            title=title, name=report.name, metric=headline.column.column.replace("_", " "), datasets=report.datasets,
            labels=report.labels, cells=headline.cells, paper_of=report.paper_lookup(headline.column)[0],
            avg=headline.average, higher_is_better=higher_is_better(report.used, report.settings),
            display={label: report.settings.get("display_names", {}).get(report.paper_model(label))
                     or latex.display_name(report.paper_model(label)) for label in report.labels}))
    render.print_lines(console, [f"wrote {', '.join(map(str, written))}"])


def committed_from_other_records(md: Path, header: list[str]) -> str | None:
    """The ``records:`` line of a report that git tracks at ``md``, when it differs from the new
    report's (another records file or other runs); None otherwise."""
    from bench_cli.results.provenance import git

    if not md.is_file() or git("ls-files", "--error-unmatch", str(md.resolve()), root=md.resolve().parent) is None:
        return None
    old = next((line[len("- records: "):] for line in md.read_text().splitlines() if line.startswith("- records: ")), None)
    new = next((h[len("records: "):] for h in header if h.startswith("records: ")), None)
    return old if old is not None and old != new else None


def _log(cfg, name: str, table_rows: list[dict]) -> None:
    from bench_cli.results.loggers import make_logger

    run_dir = Path(cfg.paths.output_dir) / "reports" / name.replace("/", "-")
    run_dir.mkdir(parents=True, exist_ok=True)
    logger = make_logger(cfg.logger, {"experiment": name, "report": OmegaConf.to_container(cfg.report)}, run_dir,
                         name=f"report-{name}", job_type="report")
    logger.log_table(f"report/{name}", [dict(r) for r in table_rows])
    logger.finish("ok")
