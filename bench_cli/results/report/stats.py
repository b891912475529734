"""The comparison with the paper: mean and sample std over seeds, the difference, the tolerance
max(2 x paper std, floor) (the paper's interval), Welch's t-test of the two means with their n
("differs" when p < 0.05, else "no evidence of a difference": absence of evidence, never a match),
the equivalence test (TOST) with the tolerance as its margin (the one "matches"), averages over
complete datasets, and the columns beside them as ratios to the baseline."""
from __future__ import annotations

import math
import statistics

from bench_cli.results.report.select import column_mean, column_std, noisy_count
from bench_cli.results.report.spec import EFFICIENCY, TIMED_COLUMNS

ALPHA = 0.05


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


def tost(m1, s1, n1, m2, s2, n2, margin: float) -> float | None:
    """The p of Schuirmann's two one-sided tests (TOST, 1987) that |m1 - m2| < ``margin``, on
    Welch's standard error and degrees of freedom: small p is evidence of equivalence within the
    margin (a large Welch p is only the absence of evidence of a difference). None when undefined."""
    if None in (m1, s1, m2, s2) or n1 < 2 or n2 < 2:
        return None
    v1, v2 = s1 * s1 / n1, s2 * s2 / n2
    diff = m1 - m2
    if v1 + v2 == 0:
        return 0.0 if abs(diff) < margin else 1.0
    from scipy import stats

    se = math.sqrt(v1 + v2)
    df = (v1 + v2) ** 2 / (v1 * v1 / (n1 - 1) + v2 * v2 / (n2 - 1))
    above_lower = float(stats.t.sf((diff + margin) / se, df))  # H0: diff <= -margin
    below_upper = float(stats.t.cdf((diff - margin) / se, df))  # H0: diff >= +margin
    return max(above_lower, below_upper)


def tolerance(paper_std: float | None, floor: float = 1.0) -> float:
    """The largest |reproduced - paper| still counted as a match: max(2 x paper std, floor). The
    comparison is symmetric, so it holds for metrics of either direction."""
    return max(2 * (paper_std or 0.0), floor)


def has_results(cells: dict, dataset: str, label: str) -> bool:
    """Whether the row ``label`` has at least one ok run on ``dataset``."""
    return bool(cells.get((dataset, label)) and cells[(dataset, label)].n)


def complete_datasets(cells: dict, datasets: list[str], labels: list[str]) -> list[str]:
    """The datasets where every row label has results: what an average row covers."""
    return [d for d in datasets if all(has_results(cells, d, m) for m in labels)]


def average_row(cells: dict, datasets: list[str], labels: list[str], paper_of, floor: float = 1.0) -> dict | None:
    """Average over the datasets where every row label has results ({label: {...}}); None unless
    there are two such datasets (an average of one repeats its rows). ``paper_of(dataset, label)``
    gives the paper's value or None."""
    complete = complete_datasets(cells, datasets, labels)
    if len(complete) < 2 or not labels:
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


def _ratio(value: float | None, base: float | None) -> float | None:
    return value / base if value is not None and base else None


def column_values(column, cell, base_cell, paper=None, base_paper=None) -> dict:
    """One spec column of one row: ours (the mean over the cell's runs) and the paper's, as ratios to
    the baseline's when ``column.ratio``. Keys: the shown value under ``csv_name``; the paper's
    under ``paper_<csv_name>`` when the column has a paper metric, else our plain mean under
    ``column``. A time also gets its spread over the runs (``<csv_name>_sd``: the sample std, of a
    ratio propagated from both means' relative stds) and ``<csv_name>_noisy``: how many of the runs
    behind it (the baseline's too, for a ratio) were flagged ``timing_noisy``."""
    mine = column_mean(cell, column.column)
    printed = paper.mean if paper else None
    out = {}
    if not column.paper_metric:
        out[column.column] = mine
    timed = column.column in TIMED_COLUMNS
    sd = column_std(cell, column.column) if timed else None
    if column.ratio:
        base = column_mean(base_cell, column.column)
        base_sd = column_std(base_cell, column.column) if timed else None
        ratio = _ratio(mine, base)
        if ratio is not None and sd is not None and base_sd is not None:
            sd = ratio * math.hypot(sd / mine if mine else 0.0, base_sd / base)
        else:
            sd = None
        mine = ratio
        printed = _ratio(printed, base_paper.mean if base_paper else None)
    out[column.csv_name] = mine
    if timed:
        out[f"{column.csv_name}_sd"] = sd
        out[f"{column.csv_name}_noisy"] = noisy_count(cell) + (noisy_count(base_cell) if column.ratio else 0)
    if column.paper_metric:
        out[f"paper_{column.csv_name}"] = printed
    return out


def _comparison(mean, std, n, pv, paper_n: int, floor) -> dict:
    if mean is None or pv is None:
        return {}
    tol = tolerance(pv.std, floor)
    # a published single run (paper_n 1) has no spread: welch gives no test (None), never a division by zero
    t, p = welch(mean, std, n, pv.mean, pv.std, paper_n)
    equivalence = tost(mean, std, n, pv.mean, pv.std, paper_n, tol)  # the margin: the same tolerance
    return dict(diff=mean - pv.mean, tolerance=tol, within_tolerance=abs(mean - pv.mean) <= tol,
                welch_t=t, welch_p=p, within_spread=None if p is None else p >= ALPHA,
                tost_p=equivalence, equivalent=None if equivalence is None else equivalence < ALPHA)


def _against_committed(mean, std, n, cell) -> dict:
    """The committed reproduction's cell beside ours, and whether ours matches it (Welch p >= ALPHA)."""
    if cell is None or not cell.n:
        return {"committed_n": 0}
    t, p = welch(mean, std, n, cell.mean, cell.std, cell.n) if mean is not None else (None, None)
    return {"committed_n": cell.n, "committed_mean": cell.mean, "committed_std": cell.std, "committed_welch_p": p,
            "matches_committed": None if p is None else p >= ALPHA}


def build_rows(cells, datasets, labels, paper_of, baseline_of, paper_n, paper_model_of=None,
               floor: float = 1.0, columns=None, committed: dict | None = None) -> list[dict]:
    """One row per (dataset, label): ours, the paper's, the comparison, and the spec ``columns``
    ((Column, paper_of or None) pairs; default the efficiency ratios). ``baseline_of(dataset,
    label)`` is (the baseline's Cell, its row label) for the ratios. ``paper_n``: the paper's runs
    per mean, a number or a function of the dataset (spec.PaperRuns.of); where it is 1, no test.
    ``committed``: the committed reproduction's cells, each compared with ours (Welch)."""
    columns = [(c, None) for c in EFFICIENCY] if columns is None else columns
    rows = []
    for d in datasets:
        runs = int(paper_n(d) if callable(paper_n) else paper_n)
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
                   "paper_table": pv.table if pv else "", "paper_n": runs}
            row.update(_comparison(mean, std, n, pv, runs, floor))
            if committed is not None:
                row.update(_against_committed(mean, std, n, committed.get((d, m))))
            base_cell, base_label = baseline_of(d, m)
            for column, column_paper in columns:
                row.update(column_values(column, cell, base_cell, column_paper and column_paper(d, m),
                                         column_paper and column_paper(d, base_label)))
            rows.append(row)
    return rows
