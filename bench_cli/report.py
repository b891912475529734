"""`attnbench report NAME`: the records of an experiment next to the paper's numbers.

For every (dataset, model): mean and sample standard deviation over seeds of the experiment's
``ok`` records, the paper's mean and std (``results/paper/*.csv``), the difference, whether it is
within the tolerance max(2 x paper std, floor) (floor: ``report.tolerance_floor``, 1 point by
default), and Welch's t-test of the two means with their n
(the gap is "within the paper's spread" when p >= 0.05). Efficiency columns (parameters, FLOPs per
sample, peak training memory, time per epoch) are ratios to the baseline model (softmax) on the same
dataset. Missing runs are gaps, never zeros; the average row covers only the datasets where every
model has results. Output: a rich table, and ``<out>/<NAME>.md`` + ``.csv``; ``logger=wandb`` logs
the table too.

Which records: those whose ``experiment`` is NAME. Runs that differ only by seed share a
``variant_key``; when a (dataset, model) cell has records of several variants (say a rerun with
other epochs) the newest variant is reported and the others are counted as ignored. Per seed the
newest ok record counts; a seed without any ok record counts as failed.

The experiment config says how (``report:``, not part of a run's identity):
  title, metric (record column, test_accuracy), baseline (softmax), baseline_experiment (take the
  baseline's runs from another experiment with the same setup), paper_csv + paper_tables (the first
  listed table with a value wins) + paper_metric + paper_split (the CSV's split column: train or
  test, where a table prints both) + paper_notes (substring filter) + paper_n (the paper's runs
  per mean, for Welch), paper_models / paper_datasets (our name -> the paper's), variants {key: an
  override swept besides the model, paper_notes: {value: substring of the paper row's notes} or
  paper_column: the CSV column holding the value (e.g. heads)} (one row per model and value),
  paper_filter {column: value} (paper rows must match, e.g. heads: 4; paper_split: test is short for
  split: test), compare (extra columns: a record column next to a paper metric -- {label, column,
  paper_metric, paper_filter, ratio: to the baseline model on both sides, digits}),
  also (a list of further {metric, paper_metric, paper_split, paper_tables?}: one more table each,
  in the Markdown and in ``<NAME>.<metric>.csv``), notes (a mapping of sentences for the Markdown).
  A column is ``compare`` (e.g. the paper's own time and memory as ratios to its baseline, beside
  ours: ``{label: time ×, column: time_per_epoch_s, paper_metric: ..., ratio: true}``); a table of
  another metric, with its own paper values, spread and tests, is ``also``.
The header states the metric's direction (the records' higher_is_better).
"""
from __future__ import annotations

import csv
import io
import math
import os
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from omegaconf import OmegaConf

from bench_cli import compose as C
from bench_cli import records
from bench_cli.errors import UserError, unknown_choice

USAGE = """\
usage: attnbench report NAME [--records PATH] [--out DIR] [--all] [overrides...]

  NAME            an experiment (attnbench ls experiments), e.g. primal_dual/table1
  --records PATH  the records file (default: results.path of the config, results/runs.csv)
  --out DIR       where NAME.md and NAME.csv go (default: reproduced/ beside the records file,
                  i.e. results/reproduced for results/runs.csv)
  --all           also list the grid's datasets that have no records (as gaps)
  --no-write      print only
  logger=wandb    also log the table to Weights & Biases
"""

EFFICIENCY = (("params", "params"), ("FLOPs", "flops_forward"), ("mem", "peak_mem_train_bytes"),
              ("time", "time_per_epoch_s"))
ALPHA = 0.05


# --- paper numbers ------------------------------------------------------------------------------
def paper_dir() -> Path:
    """results/paper of the working directory, else of the source checkout."""
    here = Path("results/paper")
    return here if here.is_dir() else Path(__file__).resolve().parents[1] / "results" / "paper"


@dataclass
class PaperValue:
    mean: float
    std: float | None
    table: str
    notes: str = ""


def _num(v) -> float | None:
    try:
        return float(v) if v not in (None, "") else None
    except ValueError:
        return None


class PaperTable:
    """The paper's numbers of the listed tables; the first listed table with a value wins."""

    def __init__(self, rows: list[dict], tables: list[str]):
        self.rows, self.tables = rows, tables

    def get(self, key, notes: str | None = None, where: dict | None = None) -> PaperValue | None:
        """The value of (dataset, model); ``notes`` a substring of the row's notes, ``where``
        {CSV column: value} the row must have (e.g. {"heads": 4}; numbers compare as numbers)."""
        dataset, model = key
        for t in self.tables:
            for r in self.rows:
                if (r["table"] == t and r["dataset"].lower() == dataset and r["model"] == model
                        and (not notes or notes in r.get("notes", "")) and matches(r, where)):
                    return PaperValue(float(r["value"]), _num(r.get("std")), t, r.get("notes", ""))
        return None

    def __getitem__(self, key) -> PaperValue:
        v = self.get(key)
        if v is None:
            raise KeyError(key)
        return v


def _same(a, b) -> bool:
    """Equal as numbers when both are numbers ('4' and '4.0'), else as text."""
    x, y = _num(a), _num(b)
    return x == y if x is not None and y is not None else str(a).strip() == str(b).strip()


def matches(row: dict, where: dict | None) -> bool:
    """The paper row has every ``column: value`` of ``where``."""
    return all(_same(row.get(str(k), ""), v) for k, v in (where or {}).items())


def load_paper(settings, directory: Path | None = None, metric: str | None = None,
               where: dict | None = None) -> tuple[PaperTable, dict]:
    """(PaperTable of the listed tables, {paper_model: printed Average of the first table}); rows
    of ``metric`` (default ``paper_metric``) matching ``where`` (default ``paper_filter``, with
    ``paper_split`` as its ``split``)."""
    path = (directory or paper_dir()) / str(settings.paper_csv)
    if not path.is_file():
        raise UserError(f"paper results {path} not found (copy ../shared/reference/*.csv to results/paper/)")
    tables = [str(t) for t in settings.get("paper_tables") or []]
    metric = metric or str(settings.get("paper_metric") or "accuracy")
    if where is None:
        where = dict(settings.get("paper_filter") or {})
        if settings.get("paper_split"):
            where["split"] = settings.paper_split
    notes = settings.get("paper_notes")
    with open(path, newline="") as f:
        rows = [r for r in csv.DictReader(f) if r["table"] in tables and r["metric"] == metric
                and _num(r["value"]) is not None and (not notes or notes in r.get("notes", "")) and matches(r, where)]
    averages = {}
    for r in rows:
        if r["dataset"] == "Average" and r["table"] == tables[0]:
            averages.setdefault(r["model"], PaperValue(float(r["value"]), _num(r.get("std")), r["table"]))
    return PaperTable([r for r in rows if r["dataset"] != "Average"], tables), averages


# --- aggregation --------------------------------------------------------------------------------
@dataclass
class Cell:
    dataset: str
    model: str
    values: dict = field(default_factory=dict)       # seed -> metric
    failed: dict = field(default_factory=dict)       # seed -> status (no ok record for that seed)
    efficiency: dict = field(default_factory=dict)   # column -> mean over ok records
    epochs: set = field(default_factory=set)
    protocols: set = field(default_factory=set)
    ignored: int = 0                                 # records of older variants
    rows: list = field(default_factory=list)         # the records used

    @property
    def n(self) -> int:
        return len(self.values)

    @property
    def mean(self) -> float | None:
        return statistics.fmean(self.values.values()) if self.values else None

    @property
    def std(self) -> float | None:
        return statistics.stdev(self.values.values()) if self.n >= 2 else None


def aggregate(rows: list[dict], metric: str, label=None) -> dict[tuple[str, str], Cell]:
    """Cells of (dataset, row label) from records (ok ones give values, others count as failed
    seeds). The label is the model name unless ``label(record)`` says otherwise (variants)."""
    label = label or (lambda r: r.get("model", ""))
    groups: dict[tuple[str, str], list[dict]] = {}
    for r in rows:
        groups.setdefault((r.get("dataset", ""), label(r)), []).append(r)
    cells = {}
    for (ds, model), rs in groups.items():
        newest = max(rs, key=lambda r: (r.get("time", ""), rs.index(r)))
        variant = newest.get("variant_key", "")
        chosen = [r for r in rs if r.get("variant_key", "") == variant]
        cell = Cell(ds, model, ignored=len(rs) - len(chosen))
        by_seed: dict[str, list[dict]] = {}
        for r in chosen:
            by_seed.setdefault(str(r.get("seed", "")), []).append(r)
        for seed, srs in by_seed.items():
            ok = [r for r in srs if r.get("status") == "ok" and _num(record_value(r, metric)) is not None]
            if ok:
                r = ok[-1]
                cell.values[seed] = float(record_value(r, metric))
                cell.rows.append(r)
                cell.protocols.add(r.get("protocol", ""))
                if _num(r.get("epochs_run")) is not None:
                    cell.epochs.add(int(float(r["epochs_run"])))
            else:
                cell.failed[seed] = srs[-1].get("status") or "failed"
        for _, col in EFFICIENCY:
            vals = [_num(r.get(col)) for r in cell.rows]
            vals = [v for v in vals if v is not None]
            if vals:
                cell.efficiency[col] = statistics.fmean(vals)
        cells[(ds, model)] = cell
    return cells


def record_value(r: dict, column: str):
    """A record's value of ``column``; ``test_score`` of records written before that column
    existed (classification only, then) is their ``test_accuracy``."""
    value = r.get(column)
    if value in (None, "") and column == "test_score":
        return r.get("test_accuracy")
    return value


def welch(m1, s1, n1, m2, s2, n2) -> tuple[float | None, float | None]:
    """(t, two-sided p) of Welch's t-test from summary statistics; None when undefined."""
    if None in (m1, s1, m2, s2) or n1 < 2 or n2 < 2:
        return None, None
    v1, v2 = s1 * s1 / n1, s2 * s2 / n2
    if v1 + v2 == 0:
        return (0.0, 1.0) if m1 == m2 else (math.copysign(math.inf, m1 - m2), 0.0)
    from scipy import stats

    res = stats.ttest_ind_from_stats(m1, s1, n1, m2, s2, n2, equal_var=False)
    return float(res.statistic), float(res.pvalue)


def tolerance(paper_std: float | None, floor: float = 1.0) -> float:
    """The largest |reproduced - paper| still counted as a match: max(2 x paper std, floor). The
    comparison is symmetric, so it holds for metrics of either direction."""
    return max(2 * (paper_std or 0.0), floor)


def average_row(cells: dict, datasets: list[str], labels: list[str], paper_of, floor: float = 1.0) -> dict | None:
    """Average over the datasets where every row label has results ({label: {...}}), else None.
    ``paper_of(dataset, label)`` gives the paper's value or None."""
    complete = [d for d in datasets if all((d, m) in cells and cells[(d, m)].n for m in labels)]
    if not complete or not labels:
        return None
    out = {"datasets": complete, "models": {}}
    for m in labels:
        means = [cells[(d, m)].mean for d in complete]
        seeds = set.intersection(*(set(cells[(d, m)].values) for d in complete))
        per_seed = [statistics.fmean(cells[(d, m)].values[s] for d in complete) for s in sorted(seeds)]
        std = statistics.stdev(per_seed) if len(per_seed) >= 2 else None
        pv = [paper_of(d, m) for d in complete]
        pmean = statistics.fmean(p.mean for p in pv) if all(pv) else None
        # the spread of a mean of independent per-dataset means: sqrt(sum of variances) / k
        pstd = (math.sqrt(sum(p.std ** 2 for p in pv)) / len(pv)
                if all(pv) and all(p.std is not None for p in pv) else None)
        out["models"][m] = {"mean": statistics.fmean(means), "std": std, "n": len(per_seed), "paper_mean": pmean,
                            "paper_std": pstd, "tolerance": tolerance(pstd, floor)}
    return out


def build_rows(cells, datasets, labels, paper_of, baseline_of, paper_n, paper_model_of=None,
               floor: float = 1.0) -> list[dict]:
    """One row per (dataset, label): ours, the paper's, the comparison, efficiency ratios to
    ``baseline_of(dataset)`` (a Cell or None)."""
    rows = []
    for d in datasets:
        base = baseline_of(d)
        for m in labels:
            cell = cells.get((d, m))
            pv = paper_of(d, m)
            mean, std, n = (cell.mean, cell.std, cell.n) if cell else (None, None, 0)
            row = {"dataset": d, "model": m, "paper_model": paper_model_of(m) if paper_model_of else m, "n": n,
                   "n_failed": len(cell.failed) if cell else 0,
                   "seeds": " ".join(sorted(cell.values, key=lambda s: (len(s), s))) if cell else "",
                   "epochs": "/".join(str(e) for e in sorted(cell.epochs)) if cell else "",
                   "mean": mean, "std": std,
                   "paper_mean": pv.mean if pv else None, "paper_std": pv.std if pv else None,
                   "paper_table": pv.table if pv else ""}
            if mean is not None and pv is not None:
                tol = tolerance(pv.std, floor)
                t, p = welch(mean, std, n, pv.mean, pv.std, int(paper_n))
                row.update(diff=mean - pv.mean, tolerance=tol, within_tolerance=abs(mean - pv.mean) <= tol,
                           welch_t=t, welch_p=p, within_spread=None if p is None else p >= ALPHA)
            for label, col in EFFICIENCY:
                v = cell.efficiency.get(col) if cell else None
                b = base.efficiency.get(col) if base else None
                row[col] = v
                row[f"{label.lower()}_ratio"] = v / b if v is not None and b else None
            rows.append(row)
    return rows


def _fmt(v, digits=2) -> str:
    return "—" if v is None else f"{v:.{digits}f}"


def _pm(mean, std, digits=None) -> str:
    """mean ± std with 2 decimals, or 3 significant digits for values below 1 (an RMSE of 0.0543)."""
    if mean is None:
        return "—"
    if digits is None:
        digits = 2 if abs(mean) >= 1 or mean == 0 else 2 - math.floor(math.log10(abs(mean)))
    return f"{mean:.{digits}f}" + (f" ± {std:.{digits}f}" if std is not None else "")


def display_rows(rows: list[dict], avg: dict | None, models: list[str]) -> list[list[str]]:
    """Table cells (``compare`` columns are appended by the caller)."""
    out = []
    for r in rows:
        n = str(r["n"]) + (f" ({r['n_failed']} failed)" if r["n_failed"] else "")
        within = "—" if r.get("within_tolerance") is None else ("yes" if r["within_tolerance"] else "NO")
        spread = "—" if r.get("welch_p") is None else (f"{'yes' if r['within_spread'] else 'no'} (p={r['welch_p']:.2f})")
        paper = _pm(r["paper_mean"], r["paper_std"]) + (f" [T{r['paper_table']}]" if r["paper_table"] else "")
        out.append([r["dataset"], r["model"], n, _pm(r["mean"], r["std"]), paper,
                    "—" if r.get("diff") is None else f"{r['diff']:+.2f}", within, spread,
                    *(_fmt(r[f"{label.lower()}_ratio"]) for label, _ in EFFICIENCY)])
    if avg:
        for m in models:
            a = avg["models"][m]
            diff = None if a["paper_mean"] is None else a["mean"] - a["paper_mean"]
            within = "—" if diff is None else ("yes" if abs(diff) <= a["tolerance"] else "NO")
            out.append([f"Average ({len(avg['datasets'])} sets)", m, str(a["n"]), _pm(a["mean"], a["std"]),
                        _pm(a["paper_mean"], a["paper_std"]) + (" [same sets]" if a["paper_mean"] is not None else ""),
                        "—" if diff is None else f"{diff:+.2f}", within, "—", "", "", "", ""])
    return out


HEADERS = ["dataset", "model", "n", "reproduced", "paper", "Δ", "within max(2σ, 1)", "Welch (p ≥ 0.05)",
           "params ×", "FLOPs ×", "mem ×", "time ×"]


def headers(floor: float = 1.0) -> list[str]:
    return [f"within max(2σ, {floor:g})" if h.startswith("within") else h for h in HEADERS]


def _markdown_table(table: list[list[str]], cols: list[str]) -> list[str]:
    return (["| " + " | ".join(cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
            + ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in table])


def markdown(title: str, header_lines: list[str], table: list[list[str]], notes: list[str], cols: list[str],
             sections: list[tuple[str, list[list[str]]]] = ()) -> str:
    """The report; ``sections`` are further (subtitle, table) pairs (``report.also``) in the columns of
    ``headers()``."""
    lines = [f"# {title}", "", *[f"- {h}" for h in header_lines], "", *_markdown_table(table, cols)]
    if notes:
        lines += ["", *[f"{n}" for n in notes]]
    for subtitle, rows in sections:
        lines += ["", f"## {subtitle}", "", *_markdown_table(rows, cols[:len(HEADERS)])]
    return "\n".join(lines) + "\n"


CSV_COLUMNS = ["dataset", "model", "paper_model", "n", "n_failed", "seeds", "epochs", "mean", "std", "paper_mean",
               "paper_std", "paper_table", "diff", "tolerance", "within_tolerance", "welch_t", "welch_p",
               "within_spread", "params", "flops_forward", "peak_mem_train_bytes", "time_per_epoch_s",
               "params_ratio", "flops_ratio", "mem_ratio", "time_ratio"]


def to_csv(rows: list[dict], avg: dict | None, models: list[str], extra_columns=()) -> str:
    columns = CSV_COLUMNS + list(extra_columns)
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=columns, extrasaction="ignore", lineterminator="\n")
    w.writeheader()

    def cell(v):
        if v is None:
            return ""
        if isinstance(v, bool):
            return str(v).lower()
        if isinstance(v, float):
            return str(int(v)) if v.is_integer() and abs(v) >= 1000 else f"{v:.4f}"
        return v

    for r in rows:
        w.writerow({k: cell(r.get(k)) for k in columns})
    if avg:
        for m in models:
            a = avg["models"][m]
            diff = None if a["paper_mean"] is None else a["mean"] - a["paper_mean"]
            w.writerow({k: cell(v) for k, v in {
                "dataset": f"Average ({' '.join(avg['datasets'])})", "model": m, "n": a["n"], "mean": a["mean"],
                "std": a["std"], "paper_mean": a["paper_mean"], "paper_std": a["paper_std"], "diff": diff,
                "tolerance": a["tolerance"], "within_tolerance": None if diff is None else abs(diff) <= a["tolerance"]}.items()})
    return buf.getvalue()


def compare_column(spec, settings, cells, table_rows, paper_model_of, paper_datasets, baseline_label, paper_where,
                   base_cells) -> dict:
    """One ``compare`` column: the mean of a record column over a cell's runs next to a paper metric
    (both as ratios to the baseline model of the same dataset with ``ratio``). Writes
    ``<label>`` / ``paper_<label>`` into the table rows; returns the header, the shown cells, the
    CSV columns and a note saying what the column is."""
    label, column = str(spec.label), str(spec.column)
    where = dict(spec.get("paper_filter") or {})
    paper, _ = load_paper(settings, metric=str(spec.paper_metric), where=where)
    digits, ratio = int(spec.get("digits", 2)), bool(spec.get("ratio", False))

    def ours(cell) -> float | None:
        vals = [_num(r.get(column)) for r in (cell.rows if cell else [])]
        vals = [v for v in vals if v is not None]
        return statistics.fmean(vals) if vals else None

    def theirs(d: str, lab: str) -> float | None:
        v = paper.get((str(paper_datasets.get(d, d)).lower(), paper_model_of(lab)), None,
                      {**where, **(paper_where(lab) or {})})
        return v.mean if v else None

    shown = []
    for row in table_rows:
        d, lab = row["dataset"], row["model"]
        mine, printed = ours(cells.get((d, lab))), theirs(d, lab)
        if ratio:
            base_lab = baseline_label(lab)
            b_mine = ours(cells.get((d, base_lab)) or base_cells.get((d, base_lab)))
            b_printed = theirs(d, base_lab)
            mine = mine / b_mine if mine is not None and b_mine else None
            printed = printed / b_printed if printed is not None and b_printed else None
        row[label], row[f"paper_{label}"] = mine, printed
        fmt = (lambda v: "—" if v is None else f"{v:,.{digits}f}")  # noqa: E731
        shown.append(f"{fmt(mine)} ({fmt(printed)})")
    what = f"ratio to {baseline_label('')}, " if ratio else ""
    filt = ", ".join(f"{k} {v}" for k, v in where.items())
    note = (f"{label}: {what}ours `{column}` (mean over the runs) and, in parentheses, the paper's "
            f"`{spec.paper_metric}`" + (f" ({filt})" if filt else "") + ".")
    return {"header": f"{label} (paper)", "shown": shown, "csv": [label, f"paper_{label}"], "note": note}


# --- the command --------------------------------------------------------------------------------
REPORT_OPTIONS = {"--records": True, "--out": True, "--all": False, "--no-write": False}


def _parse(args: list[str]):
    from bench_cli.args import parse

    p = parse("report", args, REPORT_OPTIONS)
    opts = {"records": p.get("--records"), "out": p.get("--out"), "all": bool(p.get("--all")),
            "write": not p.get("--no-write")}
    return p.positional, p.overrides, opts


def wall_clock(rows: list[dict]) -> str | None:
    """The time from the first run's start to the last run's end, with the summed run times: what
    the sweep cost on the machine that ran it (runs of several sittings make the span longer)."""
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
    total = sum((end - start).total_seconds() for start, end in spans)
    span = (max(e for _, e in spans) - min(s for s, _ in spans)).total_seconds()
    return f"{span / 60:.1f} min from the first run's start to the last run's end ({total / 60:.1f} min of runs)"


def direction_note(rows: list[dict], settings) -> str:
    """The direction of the records' selection metric (or ``report.higher_is_better``), when known."""
    flags = {str(r.get("higher_is_better", "")).lower() for r in rows} - {""}
    higher = settings.get("higher_is_better")
    if higher is None and len(flags) == 1:
        higher = flags.pop() == "true"
    return {True: " (higher is better)", False: " (lower is better)"}.get(higher, "")


def grid_axes(cfg, extra: str | None = None) -> dict[str, list[str]]:
    """Values of the experiment's sweep axes (task.dataset, model and ``extra``), in grid order."""
    params = OmegaConf.select(cfg, "hydra.sweeper.params", default=None)
    params = OmegaConf.to_container(params) if params is not None else {}
    out = {}
    for k in ("task.dataset", "model", extra):
        if k and k in params:
            out[k] = [v.strip() for v in str(params[k]).split(",") if v.strip()]
    return out


def override_value(overrides: str, key: str) -> str | None:
    """The value ``key`` was given in a record's overrides (``key=v``, ``+key=v``, ``++key=v``)."""
    for tok in (overrides or "").split():
        k, _, v = tok.partition("=")
        if k.lstrip("+~") == key:
            return v
    return None


def common_overrides(rows: list[dict], axes=("task.dataset", "model", "seed", "experiment")) -> list[str]:
    """Overrides every used record was run with, other than the grid axes."""
    sets = [r.get("overrides", "").split() for r in rows]
    if not sets:
        return []
    first = [t for t in sets[0] if t.split("=", 1)[0].lstrip("+~") not in axes]
    return [t for t in first if all(t in s for s in sets[1:])]


BUDGET_KEYS = ("trainer.max_epochs", "trainer.max_steps", "trainer.step_budget")
# Budget keys that cut another key: the header shows the experiment's own value of that one.
BUDGET_OWN = {"trainer.step_budget": "trainer.max_epochs"}


def _own_budget(name: str, keys: list[str], datasets: list[str], overrides: list[str]) -> str:
    """The experiment's own values of the budget keys, per dataset ("JapaneseVowels 400, ...")."""
    parts = []
    for d in datasets:
        try:
            cfg = C.compose_unchecked([f"experiment={name}", f"task.dataset={d}", *overrides])
            vals = [str(OmegaConf.select(cfg, k, default=None)) for k in keys]
        except Exception:  # noqa: BLE001 - a task without task.dataset: say nothing per dataset
            continue
        parts.append(f"{d} {'/'.join(vals)}")
    return f"({', '.join(parts)})" if parts else "(see the experiment config)"


@dataclass
class RowSpec:
    """What the 'model' column of a report row is: a model, or a model at one value of a variant key."""
    label: str
    model: str
    value: str | None = None


def row_specs(models: list[str], variant_key: str | None, values: list[str]) -> list[RowSpec]:
    if not variant_key:
        return [RowSpec(m, m) for m in models]
    short = variant_key.rsplit(".", 1)[-1]
    return [RowSpec(f"{m} ({short}={v})", m, v) for m in models for v in values]


def cmd_report(args: list[str]) -> None:
    from bench_cli.ui import console

    if any(a in ("-h", "--help") for a in args):
        print(USAGE)
        return
    if not args:
        raise UserError(f"give the experiment to report: attnbench report NAME; valid: {', '.join(C.group_options('experiment'))}")
    names, overrides, opts = _parse(args)
    experiments = C.group_options("experiment")
    if len(names) != 1:
        raise UserError(f"give one experiment name; valid: {', '.join(experiments)}")
    name = names[0].removeprefix("experiment=")
    if name not in experiments:
        raise unknown_choice("experiment", name, experiments)
    C.check_group_choices(overrides)
    cfg = C.compose_unchecked([f"experiment={name}", *overrides], with_hydra=True)
    settings = cfg.get("report")
    if settings is None or not settings.get("paper_csv"):
        raise UserError(f"experiment {name} has no report settings (report.paper_csv)")
    path = Path(opts["records"] or cfg.results.path)
    all_records = records.read_records(path)
    rows = [r for r in all_records if r.get("experiment") == name]
    if not rows:
        raise UserError(f"no records of experiment {name} in {path}; run `attnbench sweep experiment={name}` first")

    metric = str(settings.get("metric") or "test_score")
    floor = float(settings.get("tolerance_floor", 1.0))
    variants = settings.get("variants") or {}
    vkey = variants.get("key")
    vnotes = {str(k).lower(): v for k, v in (variants.get("paper_notes") or {}).items()}
    vcolumn = variants.get("paper_column")
    axes = grid_axes(cfg, vkey)
    models = list(axes.get("model") or [])
    models += sorted({r["model"] for r in rows} - set(models))
    values = list(axes.get(vkey) or []) if vkey else []
    if vkey:
        values += sorted({str(override_value(r.get("overrides", ""), vkey)) for r in rows} - set(values))
    specs = row_specs(models, vkey, values)
    by_label = {sp.label: sp for sp in specs}
    label_of = (lambda r: row_specs([r.get("model", "")], vkey, [str(override_value(r.get("overrides", ""), vkey))])[0].label) \
        if vkey else None

    with_records = {r["dataset"] for r in rows}
    grid_ds = axes.get("task.dataset") or []
    datasets = [d for d in grid_ds if opts["all"] or d in with_records] + sorted(with_records - set(grid_ds))
    paper, printed_avg = load_paper(settings)
    paper_models = dict(settings.get("paper_models") or {})
    paper_datasets = dict(settings.get("paper_datasets") or {})

    def paper_model_of(label: str) -> str:
        sp = by_label.get(label)
        return paper_models.get(sp.model, sp.model) if sp else label

    def lookup(table: PaperTable):
        def paper_of(d: str, label: str):
            sp = by_label.get(label)
            value = sp.value if sp and sp.value is not None else None
            notes = vnotes.get(str(value).lower()) if value is not None else None
            where = {str(vcolumn): value} if vcolumn and value is not None else None
            return table.get((str(paper_datasets.get(d, d)).lower(), paper_model_of(label)), notes, where)
        return paper_of

    paper_of = lookup(paper)
    baseline = str(settings.get("baseline") or "softmax")
    base_records = rows
    if settings.get("baseline_experiment"):
        base_records = [r for r in all_records if r.get("experiment") == settings.baseline_experiment]
    base_rows = [r for r in base_records if r.get("model") == baseline]
    labels = [sp.label for sp in specs]

    def section(column: str, paper_of):
        """(cells, table rows, average row) of one record column against the paper."""
        cells = aggregate(rows, column, label_of)
        base_cells = aggregate(base_rows, column)
        table_rows = build_rows(cells, datasets, labels, paper_of, lambda d: base_cells.get((d, baseline)),
                                settings.get("paper_n") or 5, paper_model_of, floor)
        return cells, table_rows, average_row(cells, datasets, labels, paper_of, floor)

    cells, table_rows, avg = section(metric, paper_of)
    sections = []  # the further metrics of `report.also`
    for extra_spec in settings.get("also") or []:
        extra_settings = OmegaConf.merge(settings, extra_spec)
        extra_paper, _ = load_paper(extra_settings)
        _, extra_rows, extra_avg = section(str(extra_spec.metric), lookup(extra_paper))
        subtitle = (f"{extra_spec.metric} (paper: {extra_settings.get('paper_metric')}"
                    + (f", {extra_settings.paper_split}" if extra_settings.get("paper_split") else "") + ")")
        sections.append((str(extra_spec.metric), subtitle, extra_rows, extra_avg))

    def paper_where(label: str) -> dict | None:
        sp = by_label.get(label)
        return {vcolumn: sp.value} if vcolumn and sp and sp.value is not None else None

    def baseline_label(label: str) -> str:
        """The baseline's row label at the same variant value as ``label``."""
        sp = by_label.get(label)
        return row_specs([baseline], vkey, [sp.value])[0].label if vkey and sp else baseline

    compared = [compare_column(c, settings, cells, table_rows, paper_model_of, paper_datasets, baseline_label,
                               paper_where, aggregate(base_rows, metric)) for c in settings.get("compare") or []]

    used = [r for c in cells.values() for r in c.rows]
    protocols = sorted({r.get("protocol", "") for r in used})
    seeds = sorted({r.get("seed") for r in used}, key=lambda s: (len(str(s)), str(s)))
    per_cell = sorted({c.n for c in cells.values()})
    epochs_of = {d: sorted({e for (cd, _), c in cells.items() if cd == d for e in c.epochs}) for d in datasets}
    all_epochs = sorted({e for es in epochs_of.values() for e in es})
    epochs = ("; ".join(f"{d} {'/'.join(map(str, es))}" for d, es in epochs_of.items() if es)
              if len({tuple(es) for es in epochs_of.values() if es}) > 1 else "/".join(map(str, all_epochs)))
    commits = sorted({(r.get("git_commit", "")[:10] + (" (dirty)" if r.get("git_dirty") == "true" else "")) for r in used})
    header = [
        f"protocol: {', '.join(protocols) or '—'}" + ("  (the test set selects the epoch, as the paper's code did: optimistic)"
                                                       if "paper" in protocols else ""),
        f"seeds: {len(seeds)} ({', '.join(map(str, seeds))}); runs per cell: {'/'.join(map(str, per_cell))}"
        + f"; paper n assumed {settings.get('paper_n') or 5}",
        f"epochs: {epochs or '—'}; metric: {metric}{direction_note(used, settings)}; paper: results/paper/{settings.paper_csv} "
        f"table(s) {', '.join(str(t) for t in settings.paper_tables)}",
        *([f"paper names: {', '.join(f'{k} = {v}' for k, v in paper_models.items())}"] if paper_models else []),
        f"efficiency: ratios to {baseline} on the same dataset"
        + (f" (its runs in {settings.baseline_experiment})" if settings.get("baseline_experiment") else "")
        + ": parameters, FLOPs per sample (forward), peak training-step memory, time per epoch (wall clock, 1 thread per job: noisy on a shared machine)",
        f"records: {path} ({len(used)} runs; git {', '.join(commits) or '—'}; "
        f"torch {', '.join(sorted({r.get('torch_version', '') for r in used})) or '—'})",
        *([f"wall clock: {span}"] if (span := wall_clock(used)) else []),
    ]
    axes_keys = ("task.dataset", "model", "seed", "experiment", *((vkey,) if vkey else ()))
    budget = [t for t in common_overrides(used, axes_keys) if t.split("=", 1)[0].lstrip("+") in BUDGET_KEYS]
    for token in budget:
        key, value = token.lstrip("+").split("=", 1)
        own = _own_budget(name, [BUDGET_OWN.get(key, key)], datasets, overrides)
        header.append(f"budget: {token} instead of the experiment's own {own}" if key not in BUDGET_OWN else
                      f"budget: {token}: the experiment's own {BUDGET_OWN[key]} {own}, cut to at most "
                      f"ceil({value} / optimiser steps per epoch) whole epochs")
    commands = {r.get("command") for r in used} - {None, ""}
    sweep_cmd = (commands.pop() if len(commands) == 1 else  # the command typed, launcher options included
                 " ".join(["attnbench sweep", f"experiment={name}", *common_overrides(used, axes_keys)]
                          + ([f"task.dataset={','.join(datasets)}"] if grid_ds and set(datasets) != set(grid_ds) else [])))
    header.append(f"sweep: `{sweep_cmd}`; report: `attnbench report {name}`"
                  + (f"; made by `{os.environ['ATTNBENCH_MADE_BY']}`" if os.environ.get("ATTNBENCH_MADE_BY") else ""))
    notes = []
    ignored = sum(c.ignored for c in cells.values())
    if ignored:
        notes.append(f"{ignored} older records of other configurations of the same cells were ignored (newest variant shown).")
    if printed_avg:
        shown = ", ".join(f"{sp.label} {_pm(printed_avg[paper_model_of(sp.label)].mean, printed_avg[paper_model_of(sp.label)].std)}"
                          for sp in specs if paper_model_of(sp.label) in printed_avg)
        if shown:
            notes.append(f"Paper's printed average over all its datasets (Table {settings.paper_tables[0]}): {shown}.")
    if avg is None:
        notes.append("No dataset has results for every model: no average row.")
    missing = [f"{r['dataset']}/{r['model']}" for r in table_rows if r["n"] == 0]
    if missing:
        notes.append(f"Gaps (no ok run): {', '.join(missing)}.")
    no_paper = sorted({r["dataset"] for r in table_rows if r["paper_mean"] is None})
    if no_paper:
        notes.append(f"No paper number for: {', '.join(no_paper)} (not in the paper's table).")
    extra = settings.get("notes") or []
    notes += [str(n) for n in (extra.values() if hasattr(extra, "values") else extra)]

    display = display_rows(table_rows, avg, labels)
    cols = headers(floor)
    for column in compared:  # "ours (paper)" per row; the average rows leave them empty
        cols.append(column["header"])
        for row, shown in zip(display, column["shown"] + [""] * (len(display) - len(column["shown"]))):
            row.append(shown)
        notes.append(column["note"])
    title = str(settings.get("title") or name)
    _print(console, title, header, display, notes, cols)
    extra_tables = [(subtitle, display_rows(r, a, labels)) for _, subtitle, r, a in sections]
    for subtitle, extra_display in extra_tables:
        _print(console, f"{title}: {subtitle}", [], extra_display, [], headers(floor))
    if opts["write"]:
        # Beside the records unless --out says otherwise: results/runs.csv -> results/reproduced/.
        out = Path(opts["out"] or path.parent / "reproduced") / name
        out.parent.mkdir(parents=True, exist_ok=True)
        replaced = committed_from_other_records(out.with_suffix(".md"), header)
        if replaced:
            console.print(f"[yellow]note[/]: {out.with_suffix('.md')} is committed and was made from other records "
                          f"({replaced}); it is replaced (git diff shows the change, git checkout restores it)",
                          soft_wrap=True)
        out.with_suffix(".md").write_text(markdown(title, header, display, notes, cols, extra_tables))
        out.with_suffix(".csv").write_text(to_csv(table_rows, avg, labels, [c for x in compared for c in x["csv"]]))
        written = [out.with_suffix(".md"), out.with_suffix(".csv")]
        for column, _, extra_rows, extra_avg in sections:
            written.append(out.parent / f"{out.name}.{column}.csv")
            written[-1].write_text(to_csv(extra_rows, extra_avg, labels))
        console.print(f"wrote {', '.join(map(str, written))}", soft_wrap=True)
    if cfg.logger.get("name", "none") != "none":
        _log(cfg, name, table_rows)


def committed_from_other_records(md: Path, header: list[str]) -> str | None:
    """The ``records:`` line of a report that git tracks at ``md``, when it differs from the new
    report's (another records file or other runs); None otherwise."""
    from bench_cli.records import _git

    if not md.is_file() or _git("ls-files", "--error-unmatch", str(md.resolve()), root=md.resolve().parent) is None:
        return None
    old = next((line[len("- records: "):] for line in md.read_text().splitlines() if line.startswith("- records: ")), None)
    new = next((h[len("records: "):] for h in header if h.startswith("records: ")), None)
    return old if old is not None and old != new else None


def wide(console, width: int):
    """The console itself on a terminal; a console of ``width`` columns on the same stream otherwise
    (a log file or a pipe gets the whole table instead of one squeezed into 80 columns)."""
    from rich.console import Console

    return console if console.is_terminal else Console(file=console.file, width=max(console.width, width))


def _print(console, title, header, display, notes, cols: list[str]) -> None:
    """The table as wide as its cells on a pipe or log (``wide``); on a narrower terminal one block
    per row instead of squeezed, wrapped cells (ui.show_table). Rows that miss the tolerance are red."""
    from rich.markup import escape

    from bench_cli.ui import show_table

    show_table(title, cols, [[escape(c) for c in row] for row in display], caption="\n".join(header) or None,
               row_styles=["red" if "NO" in row[6:7] else None for row in display], out=wide(console, 200))
    for n in notes:
        console.print(escape(n), soft_wrap=True)


def _log(cfg, name: str, table_rows: list[dict]) -> None:
    from bench_cli.loggers import make_logger

    run_dir = Path(cfg.paths.output_dir) / "reports" / name.replace("/", "-")
    run_dir.mkdir(parents=True, exist_ok=True)
    logger = make_logger(cfg.logger, {"experiment": name, "report": OmegaConf.to_container(cfg.report)}, run_dir,
                         name=f"report-{name}", job_type="report")
    logger.log_table(f"report/{name}", [{k: v for k, v in r.items()} for r in table_rows])
    logger.finish("ok")
