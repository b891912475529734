"""The confirmation of an Optuna search in a report: each study's best settings rerun over seeds
(bench_cli/commands/study_confirm.py: records with ``confirms_trial``), their validation and test
scores as mean ± std over the seeds, and which the study selects by its mean validation score. The
report says which selection it shows: confirmed over seeds, or one seed's validation score."""
from __future__ import annotations

import statistics

from bench_cli.core.ui import DASH, mean_pm
from bench_cli.results.report.paper import number

SECTION = "the best settings confirmed over seeds (mean validation score selects)"
COLUMNS = ["study", "trial", "seeds", "val", "test", "selected"]


def _stats(values: list[float]) -> tuple[float | None, float | None]:
    if not values:
        return None, None
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else None)


def confirmations(rows: list[dict]) -> list[dict]:
    """One row per confirmed (study, trial): its seeds, mean ± std of val_score and test_score, and
    whether it is the study's selection (the best mean validation score over seeds)."""
    confirmed: dict[tuple[str, str], dict[str, dict]] = {}
    for r in rows:
        if r.get("study") and r.get("confirms_trial") not in (None, "") and r.get("status") == "ok":
            confirmed.setdefault((r["study"], str(r["confirms_trial"])), {})[str(r.get("seed"))] = r
    for r in rows:  # a trial's own run is the confirmation of its seed
        key = (r.get("study"), str(r.get("trial")))
        if key in confirmed and r.get("status") == "ok" and str(r.get("seed")) not in confirmed[key]:
            confirmed[key][str(r.get("seed"))] = r
    out = []
    for (study, trial), by_seed in confirmed.items():
        val = _stats([v for r in by_seed.values() if (v := number(r.get("val_score"))) is not None])
        test = _stats([v for r in by_seed.values() if (v := number(r.get("test_score"))) is not None])
        higher = str(next(iter(by_seed.values())).get("higher_is_better", "true")).lower() != "false"
        out.append({"study": study, "trial": trial, "seeds": sorted(by_seed, key=lambda s: (len(s), s)),
                    "val": val, "test": test, "higher": higher, "selected": False})
    for study in dict.fromkeys(r["study"] for r in out):
        mine = [r for r in out if r["study"] == study and r["val"][0] is not None]
        if mine:
            pick = max if mine[0]["higher"] else min
            pick(mine, key=lambda r: r["val"][0])["selected"] = True
    return out


def display(table: list[dict]) -> list[list[str]]:
    return [[r["study"], r["trial"], " ".join(r["seeds"]), mean_pm(*r["val"]), mean_pm(*r["test"]),
             "yes" if r["selected"] else DASH] for r in table]


def selection_line(table: list[dict]) -> str:
    """Which selection the report shows."""
    if not table:
        return ("selection: one seed's validation score per trial (not confirmed over seeds: "
                "tuning.confirm_top and tuning.confirm_seeds rerun the best settings)")
    seeds = max(len(r["seeds"]) for r in table)
    return (f"selection: the best settings of each study rerun over up to {seeds} seeds; the one with the best "
            "mean validation score is selected (below), not the best single trial")
