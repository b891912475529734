"""Two models compared on the same test samples (``report --pair A,B``), beside Welch's test of seeds.

Welch's test of two means over seeds (stats.welch) asks whether the seeds' spread hides the
difference; it ignores that both models answered the very same test samples, which a paired test
uses (lm-evaluation-harness's per-sample logs and bootstrap errors serve the same end). Per dataset,
from the per-sample outputs each record keeps (bench_cli/results/samples.py), over the seeds both
models ran:

- each sample's score, averaged over those seeds: correct (100 or 0) for accuracy, else the
  per-sample loss (cross-entropy, squared error; lower is better);
- the difference A - B of the mean scores, with a 95% paired bootstrap interval: the test samples
  resampled with replacement (BOOTSTRAP resamples, a fixed generator), the same resample for both
  models, the percentile interval (Efron & Tibshirani 1993, ch. 13);
- for accuracy, McNemar's exact test per seed (the discordant pairs, binomial with p = 1/2; McNemar
  1947): the median p over the seeds and how many seeds give p < 0.05;
- Welch's p of the two records' means over seeds.

Records whose targets differ (other test samples, another split or order) are not paired: a note
says so instead of a number.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass

import numpy as np

from bench_cli.core.errors import UserError
from bench_cli.results import samples
from bench_cli.results.report import select
from bench_cli.results.report.stats import ALPHA, welch

BOOTSTRAP = 2000
LEVEL = 0.95
COLUMNS = ["dataset", "seeds", "A", "B", "A - B", "95% CI (paired)", "McNemar p", "Welch p"]


@dataclass
class Pair:
    dataset: str
    seeds: list[str]
    score: str          # 'accuracy' or 'loss' (per sample)
    mean_a: float | None = None
    mean_b: float | None = None
    diff: float | None = None
    low: float | None = None
    high: float | None = None
    mcnemar_p: list[float] | None = None
    welch_p: float | None = None
    note: str = ""


def mcnemar(correct_a: np.ndarray, correct_b: np.ndarray) -> float:
    """McNemar's exact two-sided p of two classifiers on the same samples (boolean arrays)."""
    from scipy.stats import binomtest

    only_a, only_b = int(np.sum(correct_a & ~correct_b)), int(np.sum(~correct_a & correct_b))
    return 1.0 if only_a + only_b == 0 else float(binomtest(only_a, only_a + only_b, 0.5).pvalue)


def bootstrap_interval(diffs: np.ndarray, resamples: int = BOOTSTRAP, level: float = LEVEL) -> tuple[float, float]:
    """The percentile interval of the mean of ``diffs`` (per-sample differences) over resamples of
    the samples with replacement."""
    rng = np.random.default_rng(0)
    means = diffs[rng.integers(0, len(diffs), size=(resamples, len(diffs)))].mean(axis=1)
    tail = (1 - level) / 2 * 100
    return float(np.percentile(means, tail)), float(np.percentile(means, 100 - tail))


def _scores(outputs: dict, accuracy: bool) -> np.ndarray:
    if accuracy:
        return (outputs["prediction"] == outputs["target"]).astype(float) * 100
    return outputs["loss"].astype(float)


def compare(dataset: str, cell_a: select.Cell, cell_b: select.Cell) -> Pair:
    """The paired comparison of two cells of one dataset (the records each cell uses)."""
    rows_a, rows_b = ({str(r.get("seed")): r for r in c.rows} for c in (cell_a, cell_b))
    seeds = sorted(set(rows_a) & set(rows_b), key=lambda s: (len(s), s))
    accuracy = all(r.get("metric") == "accuracy" for r in [*rows_a.values(), *rows_b.values()])
    pair = Pair(dataset, seeds, "accuracy" if accuracy else "loss")
    pair.welch_p = welch(cell_a.mean, cell_a.std, cell_a.n, cell_b.mean, cell_b.std, cell_b.n)[1]
    outputs = [(samples.load(rows_a[s]), samples.load(rows_b[s])) for s in seeds]
    if not seeds:
        pair.note = "no seed that both ran"
    elif any(a is None or b is None for a, b in outputs):
        pair.note = "per-sample outputs missing (results.samples=false, or run folders not here)"
    elif any(len(a["target"]) != len(b["target"]) or not np.array_equal(a["target"], b["target"]) for a, b in outputs):
        pair.note = "not the same test samples (their targets differ)"
    if pair.note:
        return pair
    score_a = np.mean([_scores(a, accuracy) for a, _ in outputs], axis=0)
    score_b = np.mean([_scores(b, accuracy) for _, b in outputs], axis=0)
    pair.mean_a, pair.mean_b = float(score_a.mean()), float(score_b.mean())
    pair.diff = pair.mean_a - pair.mean_b
    pair.low, pair.high = bootstrap_interval(score_a - score_b)
    if accuracy:
        pair.mcnemar_p = [mcnemar(a["prediction"] == a["target"], b["prediction"] == b["target"]) for a, b in outputs]
    return pair


def pairs(rows: list[dict], label_of, model_a: str, model_b: str) -> list[Pair]:
    """The comparisons of rows labelled ``model_a`` and ``model_b`` (``label_of``: a record's
    group label, its model by default), one per dataset where both have ok records."""
    cells = select.aggregate(rows, "test_score", label_of)
    labels = {label for _, label in cells}
    for name in (model_a, model_b):
        if name not in labels:
            raise UserError(f"--pair {model_a},{model_b}: no records of {name!r} (valid: {', '.join(sorted(labels))})")
    datasets = sorted({d for d, _ in cells})
    return [compare(d, cells[(d, model_a)], cells[(d, model_b)]) for d in datasets
            if cells.get((d, model_a)) and cells.get((d, model_b)) and cells[(d, model_a)].n and cells[(d, model_b)].n]


def title(model_a: str, model_b: str) -> str:
    return f"{model_a} (A) vs {model_b} (B) on the same test samples"


def _fixed(v: float | None, digits: int = 2) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def _p(v: float | None) -> str:
    return "-" if v is None else f"{v:.3f}" if v >= 0.001 else f"{v:.0e}"


def display(found: list[Pair]) -> list[list[str]]:
    """The table's cells, one row per dataset."""
    out = []
    for p in found:
        mcnemar_cell = "-"
        if p.mcnemar_p:
            below = sum(v < ALPHA for v in p.mcnemar_p)
            mcnemar_cell = f"{_p(statistics.median(p.mcnemar_p))} ({below}/{len(p.mcnemar_p)})"
        ci = f"[{_fixed(p.low)}, {_fixed(p.high)}]" if p.low is not None else p.note
        out.append([p.dataset, str(len(p.seeds)), _fixed(p.mean_a), _fixed(p.mean_b), _fixed(p.diff), ci,
                    mcnemar_cell, _p(p.welch_p)])
    return out


def notes(found: list[Pair], model_a: str, model_b: str) -> list[str]:
    scores = {p.score for p in found}
    what = ("accuracy (%), each sample correct or not" if scores == {"accuracy"}
            else "the mean per-sample loss (lower is better)" if scores == {"loss"} else "accuracy or per-sample loss")
    return [f"A = {model_a}, B = {model_b}: {what}, each sample's score averaged over the seeds both ran, on the "
            f"same test samples. 95% CI: paired bootstrap of A - B over the test samples ({BOOTSTRAP} resamples, "
            "percentile). McNemar p: exact, per seed; the median over the seeds (in brackets: seeds with p < 0.05). "
            "Welch p: the two means over seeds (the seeds' spread, not the samples'). A CI that excludes 0 is a "
            "difference on these samples; it says nothing of other test sets."]
