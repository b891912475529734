"""The one column spec of a report (``report.columns`` of an experiment config) and its rows.

A column is a record column shown beside the paper's numbers::

    columns:
      - {column: test_accuracy, paper_metric: accuracy, paper_filter: {split: test}, table: own}
      - {column: test_loss, paper_metric: loss, paper_filter: {split: test}, label: test loss, digits: 3}
      - {column: time_per_epoch_s, paper_metric: epoch_time_s, ratio: true, label: epoch time ×}

- ``column``: the record column (mean over the runs of a cell).
- ``paper_metric``: the paper CSV's ``metric`` it sits next to (none: no paper values).
- ``paper_filter``: ``{paper CSV column: value}`` the paper's row must have (``split: test``).
- ``ratio``: ours and the paper's as ratios to the baseline model on the same dataset (and row).
- ``table``: ``own`` -- a table of its own with the spread, the tolerance and Welch's test; the
  first ``own`` column is the report's headline table, the others follow it (Markdown sections
  and ``<NAME>.<column>.csv``). ``inline`` -- a cell ``ours (paper's)`` beside the headline
  table's rows. ``every`` -- a cell beside the rows of every table (the efficiency ratios, below).
- ``label`` (header; default the column) and ``digits`` (decimals of an inline cell, default 2).

Every report shows the ``EFFICIENCY`` columns (ratios to the baseline of parameters, FLOPs, peak
memory, epoch time) in every table. ``report.rows_by`` splits the rows: one row per model and
value of an override swept besides the model (``key``); the paper's row of that value is the one
whose ``paper_column`` holds it, or whose notes contain ``paper_notes[value]``. A list of such
entries splits by every key (one row per model and combination of values, e.g. s x eta of the
Primal-Attention supplement's Table 1), matched to the paper's row that has all of them::

    rows_by: {key: task.backbone.n_heads, paper_column: heads}
    rows_by: [{key: model.attention.low_rank, paper_column: s}, {key: model.eta, paper_column: eta}]
"""
from __future__ import annotations

from dataclasses import dataclass, field

from bench_cli.core.errors import UserError

TABLES = ("own", "inline", "every")
COLUMN_KEYS = ("column", "paper_metric", "paper_filter", "ratio", "table", "label", "digits")
ROWS_BY_KEYS = ("key", "paper_column", "paper_notes")
SETTINGS = ("title", "paper_csv", "paper_tables", "paper_n", "paper_models", "paper_datasets", "baseline",
            "baseline_experiment", "tolerance_floor", "higher_is_better", "notes", "rows_by", "columns",
            "budget",  # budget: the run's budget in words, a header line (the zoo's cases set one each)
            "case_title")  # the zoo's plot title of a case; an experiment built on a case inherits it
REPLACED = ("metric", "paper_metric", "paper_split", "paper_filter", "paper_notes", "also", "compare", "variants")


@dataclass(frozen=True)
class Column:
    column: str
    paper_metric: str | None = None
    paper_filter: dict = field(default_factory=dict)
    ratio: bool = False
    table: str = "inline"
    label: str | None = None
    digits: int = 2
    what: str = ""            # what the header's efficiency line calls it (EFFICIENCY only)
    csv: str | None = None    # the CSV column of the shown value (default: the label)

    @property
    def name(self) -> str:
        return self.label or self.column

    @property
    def csv_name(self) -> str:
        return self.csv or self.name

    @property
    def header(self) -> str:
        return f"{self.name} (paper)" if self.paper_metric else self.name

    @property
    def subtitle(self) -> str:
        """The heading of its own table: the column, the paper's metric and the filter's values."""
        shown = [str(self.paper_metric or "none"), *(str(v) for v in self.paper_filter.values())]
        return f"{self.column} (paper: {', '.join(shown)})"


# Record columns that are times: a report shows their spread over the runs and, when a run was
# flagged ``timing_noisy`` (bench_cli.engine.timing.TimingSession), says so next to the value.
TIMED_COLUMNS = frozenset({"time_per_epoch_s", "train_time_s", "wall_time_s", "infer_time_s", "infer_time_per_batch_s"})

EFFICIENCY = (
    Column("params", ratio=True, table="every", label="params ×", csv="params_ratio", what="parameters"),
    Column("flops_forward", ratio=True, table="every", label="FLOPs ×", csv="flops_ratio",
           what="FLOPs per sample (forward)"),
    Column("peak_mem_train_bytes", ratio=True, table="every", label="mem ×", csv="mem_ratio",
           what="peak training-step memory"),
    Column("time_per_epoch_s", ratio=True, table="every", label="time ×", csv="time_ratio",
           what="time per epoch (wall clock, 1 thread per job: noisy on a shared machine)"),
)


@dataclass(frozen=True)
class RowsBy:
    """One ``report.rows_by`` entry: rows per value of ``key``, matched to the paper's rows by a column or notes."""
    key: str
    paper_column: str | None = None
    paper_notes: dict = field(default_factory=dict)


PAPER_N_DEFAULT = 5  # the papers' usual runs per mean, where report.paper_n says nothing


@dataclass(frozen=True)
class PaperRuns:
    """``report.paper_n``: the paper's runs per mean (Welch's n), one number or per dataset (our
    dataset names, ``default`` for the others), e.g. ``paper_n: {default: 5, imagenet: 1}``. A
    dataset of one run has no published spread: its rows get no test (stats.build_rows)."""
    default: int = PAPER_N_DEFAULT
    per_dataset: dict = field(default_factory=dict)

    def of(self, dataset: str) -> int:
        return self.per_dataset.get(dataset, self.default)

    def __str__(self) -> str:
        others = ", ".join(f"{d} {n}" for d, n in self.per_dataset.items() if n != self.default)
        return f"{self.default}" + (f" ({others})" if others else "")


def paper_runs(setting) -> PaperRuns:
    """The PaperRuns of a ``report.paper_n`` value (none: 5); a count that is not a positive
    integer is one line."""
    given = dict(setting) if isinstance(setting, dict) else {"default": PAPER_N_DEFAULT if setting is None else setting}
    for key, n in given.items():
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            where = "report.paper_n" + (f".{key}" if isinstance(setting, dict) else "")
            raise UserError(f"{where}: {n!r} is not a positive integer (the paper's runs per mean: a number, "
                            "or a mapping {dataset: n} with `default` for the other datasets)")
    counts = {str(k): int(v) for k, v in given.items()}
    return PaperRuns(counts.pop("default", PAPER_N_DEFAULT), counts)


@dataclass(frozen=True)
class Layout:
    """What a report shows: the headline column, further tables, inline and every-table columns."""
    headline: Column
    own: tuple[Column, ...]
    inline: tuple[Column, ...]
    every: tuple[Column, ...] = EFFICIENCY
    rows_by: tuple[RowsBy, ...] = ()   # the keys that split the rows, outermost first
    paper_runs: PaperRuns = PaperRuns()  # report.paper_n

    @property
    def tables(self) -> tuple[Column, ...]:
        return (self.headline, *self.own)


def column(spec: dict, where: str) -> Column:
    """A Column from one ``report.columns`` entry; unknown keys and tables are one-line errors."""
    unknown = sorted(set(spec) - set(COLUMN_KEYS))
    if unknown or "column" not in spec:
        raise UserError(f"{where}: " + (f"unknown key(s) {', '.join(unknown)}" if unknown else "no `column`")
                        + f"; a column has {', '.join(COLUMN_KEYS)}")
    table = str(spec.get("table") or "inline")
    if table not in TABLES:
        raise UserError(f"{where}: table {table!r} is not one of {', '.join(TABLES)}")
    metric = spec.get("paper_metric")
    return Column(str(spec["column"]), None if metric in (None, "") else str(metric),
                  {str(k): v for k, v in (spec.get("paper_filter") or {}).items()}, bool(spec.get("ratio", False)),
                  table, None if spec.get("label") is None else str(spec["label"]), int(spec.get("digits", 2)))


def layout(settings: dict) -> Layout:
    """The Layout of a ``report:`` mapping (plain containers), checked: the keys that ``columns``
    replaced say so, and the first ``own`` column is the headline."""
    replaced = sorted(set(settings) & set(REPLACED))
    if replaced:
        raise UserError(f"report.{', report.'.join(replaced)}: replaced by report.columns (one entry per column: "
                        f"{', '.join(COLUMN_KEYS)}) and report.rows_by; see bench_cli/results/report/spec.py")
    unknown = sorted(set(settings) - set(SETTINGS))
    if unknown:
        raise UserError(f"unknown report setting(s) {', '.join(unknown)}; valid: {', '.join(SETTINGS)}")
    columns = [column(c, f"report.columns[{i}]") for i, c in enumerate(settings.get("columns") or [])]
    own = [c for c in columns if c.table == "own"]
    if not own:
        raise UserError("report.columns has no column with table: own (the first one is the report's headline)")
    rows_by = settings.get("rows_by") or []
    entries = [rows_by_entry(e, f"report.rows_by[{i}]") for i, e in enumerate(rows_by)] if isinstance(
        rows_by, list) else [rows_by_entry(rows_by, "report.rows_by")]
    return Layout(own[0], tuple(own[1:]), tuple(c for c in columns if c.table == "inline"),
                  EFFICIENCY + tuple(c for c in columns if c.table == "every"), tuple(entries),
                  paper_runs(settings.get("paper_n")))


def rows_by_entry(entry, where: str) -> RowsBy:
    """A RowsBy from one ``report.rows_by`` mapping; a missing ``key`` or an unknown one is a one-line error."""
    unknown = sorted(set(entry) - set(ROWS_BY_KEYS)) if isinstance(entry, dict) else []
    if not isinstance(entry, dict) or unknown or "key" not in entry:
        raise UserError(f"{where}: " + (f"unknown key(s) {', '.join(unknown)}" if unknown else "no `key`")
                        + f"; an entry has {', '.join(ROWS_BY_KEYS)} (a list of entries splits by each)")
    return RowsBy(str(entry["key"]), entry.get("paper_column"),
                  {str(k).lower(): str(v) for k, v in (entry.get("paper_notes") or {}).items()})
