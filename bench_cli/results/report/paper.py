"""The paper's numbers (``results/paper/*.csv``): one row per (table, dataset, model, metric), with
its std, split, notes and the columns that tell rows apart (heads, s, ...)."""
from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

from bench_cli.core.errors import UserError


def paper_dir() -> Path:
    """results/paper of the working directory, else of the source checkout."""
    here = Path("results/paper")
    return here if here.is_dir() else Path(__file__).resolve().parents[3] / "results" / "paper"


@dataclass
class PaperValue:
    mean: float
    std: float | None
    table: str
    notes: str = ""


def number(v) -> float | None:
    """A CSV cell as a number, None when blank or not a number."""
    try:
        return float(v) if v not in (None, "") else None
    except ValueError:
        return None


def _same(a, b) -> bool:
    """Equal as numbers when both are numbers ('4' and '4.0'), else as text."""
    x, y = number(a), number(b)
    return x == y if x is not None and y is not None else str(a).strip() == str(b).strip()


def matches(row: dict, where: dict | None) -> bool:
    """The paper row has every ``column: value`` of ``where``."""
    return all(_same(row.get(str(k), ""), v) for k, v in (where or {}).items())


class PaperTable:
    """The paper's numbers of the listed tables; the first listed table with a value wins."""

    def __init__(self, rows: list[dict], tables: list[str]):
        self.rows, self.tables = rows, tables

    def get(self, key, notes: str | list | None = None, where: dict | None = None) -> PaperValue | None:
        """The value of (dataset, model); ``notes`` a substring (or a list of substrings, None
        entries skipped) of the row's notes, ``where`` {CSV column: value} the row must have (e.g.
        {"heads": 4}; numbers compare as numbers)."""
        dataset, model = key
        wanted = [n for n in ([notes] if isinstance(notes, str) else notes or []) if n]
        for t in self.tables:
            for r in self.rows:
                if (r["table"] == t and r["dataset"].lower() == dataset and r["model"] == model
                        and all(n in r.get("notes", "") for n in wanted) and matches(r, where)):
                    return PaperValue(float(r["value"]), number(r.get("std")), t, r.get("notes", ""))
        return None

    def __getitem__(self, key) -> PaperValue:
        v = self.get(key)
        if v is None:
            raise KeyError(key)
        return v


def load_paper(settings, metric: str | None = "accuracy", where: dict | None = None,
               directory: Path | None = None) -> tuple[PaperTable, dict]:
    """(PaperTable of ``settings.paper_tables`` for ``metric`` and rows matching ``where``,
    {paper model: the printed Average of the first table}). No metric: an empty table."""
    path = (directory or paper_dir()) / str(settings.get("paper_csv"))
    if not path.is_file():
        raise UserError(f"paper results {path} not found (copy ../shared/reference/*.csv to results/paper/)")
    tables = [str(t) for t in settings.get("paper_tables") or []]
    with open(path, newline="") as f:
        rows = [r for r in csv.DictReader(f) if metric and r["table"] in tables and r["metric"] == metric
                and number(r["value"]) is not None and matches(r, where)]
    averages = {}
    for r in rows:
        if r["dataset"] == "Average" and r["table"] == tables[0]:
            averages.setdefault(r["model"], PaperValue(float(r["value"]), number(r.get("std")), r["table"]))
    return PaperTable([r for r in rows if r["dataset"] != "Average"], tables), averages
