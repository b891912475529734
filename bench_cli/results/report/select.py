"""Which records a report counts, and into which cells.

Runs that differ only by seed share a ``variant_key``; when a (dataset, row) cell has records of
several variants (say a rerun with other epochs) the newest variant is reported and the others are
counted as ignored. Per seed the newest ok record counts; a seed without any ok record counts as
failed. Everything here reads record columns; nothing composes a config.
"""
from __future__ import annotations

import itertools
import math
import statistics
from dataclasses import dataclass, field

from bench_cli.results.report.paper import number


@dataclass
class Cell:
    dataset: str
    model: str
    values: dict = field(default_factory=dict)       # seed -> metric
    failed: dict = field(default_factory=dict)       # seed -> status (no ok record for that seed)
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


def duplicates_note(dropped: int) -> list[str]:
    """The note of the rows ``job_records.one_row_per_job`` dropped (none: no note)."""
    return [f"{dropped} duplicate ok row{'s' if dropped > 1 else ''} of an already recorded job_key dropped "
            "(the same job run twice, e.g. by two sweeps of one records file): each job counts once, "
            "with its latest ok row."] if dropped else []


NOT_FINITE = "ok, but {column} {value}"  # the failed status of a seed whose value is nan or inf


def finite(v) -> float | None:
    """A CSV cell as a finite number; None when blank, not a number, nan or infinite."""
    value = number(v)
    return value if value is not None and math.isfinite(value) else None


def not_finite_note(cells) -> list[str]:
    """The note of the seeds left out because their ok record's value is nan or inf."""
    shown = [f"{c.dataset}/{c.model} seed {seed} ({status.split(', but ', 1)[1]})" for c in cells
             for seed, status in c.failed.items() if status.startswith("ok, but ")]
    return [f"Left out of the means, as failed seeds: ok records whose value is not finite: {', '.join(shown)}."] \
        if shown else []


def record_value(r: dict, column: str):
    """A record's value of ``column``; ``test_score`` of records written before that column
    existed (classification only, then) is their ``test_accuracy``."""
    value = r.get(column)
    if value in (None, "") and column == "test_score":
        return r.get("test_accuracy")
    return value


def column_mean(cell: Cell | None, column: str) -> float | None:
    """The mean of ``column`` over the records a cell uses (None: no values)."""
    values = [v for v in (finite(r.get(column)) for r in (cell.rows if cell else [])) if v is not None]
    return statistics.fmean(values) if values else None


def column_std(cell: Cell | None, column: str) -> float | None:
    """The sample standard deviation of ``column`` over the records a cell uses (None: fewer than 2)."""
    values = [v for v in (number(r.get(column)) for r in (cell.rows if cell else [])) if v is not None]
    return statistics.stdev(values) if len(values) > 1 else None


def noisy_count(cell: Cell | None) -> int:
    """How many of the records a cell uses were timed on a busy machine or spread widely (``timing_noisy``)."""
    return sum(1 for r in (cell.rows if cell else []) if r.get("timing_noisy"))


def _cell(ds: str, label: str, records: list[dict], column: str) -> Cell:
    newest = max(records, key=lambda r: (r.get("time", ""), records.index(r)))
    variant = newest.get("variant_key", "")
    chosen = [r for r in records if r.get("variant_key", "") == variant]
    cell = Cell(ds, label, ignored=len(records) - len(chosen))
    by_seed: dict[str, list[dict]] = {}
    for r in chosen:
        by_seed.setdefault(str(r.get("seed", "")), []).append(r)
    for seed, srs in by_seed.items():
        ok = [r for r in srs if r.get("status") == "ok" and finite(record_value(r, column)) is not None]
        if not ok:
            last = srs[-1]
            value = number(record_value(last, column))
            if last.get("status") == "ok" and value is not None:  # nan or inf: shown as such, out of the means
                cell.failed[seed] = NOT_FINITE.format(column=column, value=value)
            else:
                cell.failed[seed] = last.get("status") or "failed"
            continue
        r = ok[-1]
        cell.values[seed] = float(record_value(r, column))
        cell.rows.append(r)
        cell.protocols.add(r.get("protocol", ""))
        if number(r.get("epochs_run")) is not None:
            cell.epochs.add(int(float(r["epochs_run"])))
    return cell


def aggregate(rows: list[dict], column: str, label=None) -> dict[tuple[str, str], Cell]:
    """Cells of (dataset, row label) from records (ok ones give values, others count as failed
    seeds). The label is the model name unless ``label(record)`` says otherwise (rows_by)."""
    label = label or (lambda r: r.get("model", ""))
    groups: dict[tuple[str, str], list[dict]] = {}
    for r in rows:
        groups.setdefault((r.get("dataset", ""), label(r)), []).append(r)
    return {key: _cell(*key, rs, column) for key, rs in groups.items()}


def override_value(overrides: str, key: str) -> str | None:
    """The value ``key`` was given in a record's ``overrides`` column (``key=v``, ``+key=v``)."""
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


@dataclass(frozen=True)
class RowSpec:
    """What the 'model' column of a report row is: a model, or a model at one value of each rows_by key."""
    label: str
    model: str
    values: tuple[str, ...] = ()


def row_specs(models: list[str], keys: tuple[str, ...], values: list[tuple[str, ...]]) -> list[RowSpec]:
    """One row per model and combination of the keys' ``values``: ``standard (n_heads=4)``,
    ``primalformer (low_rank=20, eta=0.1)``."""
    if not keys:
        return [RowSpec(m, m) for m in models]
    shorts = [k.rsplit(".", 1)[-1] for k in keys]
    return [RowSpec(f"{m} ({', '.join(f'{k}={v}' for k, v in zip(shorts, vs))})", m, tuple(vs))
            for m in models for vs in values]


class Rows:
    """The report's rows: models in grid order (then the others with records), times the values of
    the ``rows_by`` keys (each key's grid values, then the others its records have; every
    combination, the first key outermost); labels like ``standard (n_heads=4)``."""

    def __init__(self, records: list[dict], grid_models: list[str], keys: tuple[str, ...] = (),
                 grid_values: dict[str, list[str]] | None = None):
        self.keys = tuple(keys)
        models = list(grid_models) + sorted({r["model"] for r in records} - set(grid_models))
        per_key = []
        for key in self.keys:
            given = list((grid_values or {}).get(key) or [])
            per_key.append(given + sorted({str(override_value(r.get("overrides", ""), key)) for r in records}
                                          - set(given)))
        self.specs = row_specs(models, self.keys, list(itertools.product(*per_key)))
        self.by_label = {sp.label: sp for sp in self.specs}

    @property
    def labels(self) -> list[str]:
        return [sp.label for sp in self.specs]

    def values_of(self, record: dict) -> tuple[str, ...]:
        return tuple(str(override_value(record.get("overrides", ""), key)) for key in self.keys)

    def label_of(self, record: dict) -> str:
        return row_specs([record.get("model", "")], self.keys, [self.values_of(record)])[0].label

    def with_model(self, label: str, model: str) -> str:
        """The label of ``model`` at the same rows_by values as ``label`` (the baseline's row)."""
        sp = self.by_label.get(label)
        return row_specs([model], self.keys, [sp.values])[0].label if sp else model


def planned_epochs(used: list[dict], datasets: list[str]) -> str:
    """'JapaneseVowels 60, BasicMotions 300': the records' ``epochs_planned`` per dataset."""
    parts = []
    for d in datasets:
        planned = sorted({int(float(r["epochs_planned"])) for r in used
                          if r.get("dataset") == d and number(r.get("epochs_planned")) is not None})
        if planned:
            parts.append(f"{d} {'/'.join(map(str, planned))}")
    return ", ".join(parts)


def step_budgets(used: list[dict]) -> list[str]:
    """The records' ``step_budget`` values (blank: the full schedule)."""
    return sorted({str(int(float(r["step_budget"]))) for r in used if number(r.get("step_budget")) is not None},
                  key=int)
