"""The best trial of each Optuna study in a records file (`attnbench sweep hydra/sweeper=optuna`):
`attnbench report NAME` of an experiment with ``report.kind: study``, and a section of the report of
any records file whose rows carry a study. Selection reads the trials' validation score
(``val_score``) in the metric's direction, as the study did; the test score of the trial it selects
is shown beside it, never used to choose."""
from __future__ import annotations

from pathlib import Path

from bench_cli.core.ui import DASH, csv_value, fixed
from bench_cli.results import csv_store
from bench_cli.results.job_records import one_row_per_job
from bench_cli.results.report import confirmed, render, select
from bench_cli.results.report.common import made_by, overrides_of, records_line, rerun_command

SECTION = "best trial per study (validation selects; test reported)"
COLUMNS = ["study", "model", "dataset", "trials", "ok", "best trial", "val", "test", "values"]
CSV_COLUMNS = ["study", "model", "dataset", "trials", "ok", "best_trial", "val_score", "test_score", "values",
               "run_id"]


def _number(value) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if number == number else None  # NaN: no value


def searched_values(rows: list[dict]) -> dict[str, list[str]]:
    """{run_id: the overrides whose value differs between the study's trials} (what Optuna chose)."""
    given = {r.get("run_id"): overrides_of(r) for r in rows}
    keys = [k for k in dict.fromkeys(k for o in given.values() for k in o)
            if len({o.get(k) for o in given.values()}) > 1]
    return {run: [f"{k}={o[k]}" for k in keys if k in o] for run, o in given.items()}


def best_trials(rows: list[dict]) -> list[dict]:
    """One row per study (first-seen order): its trials, how many ended ok, and the ok trial with
    the best validation score in its metric's direction (ties: the earlier trial)."""
    rows, _ = one_row_per_job(rows)
    studies: dict[str, list[dict]] = {}
    for r in rows:
        if r.get("study") and r.get("confirms_trial") in (None, ""):  # a confirmation run is no trial
            studies.setdefault(r["study"], []).append(r)
    out = []
    for name, trials in studies.items():
        scored = [(v, r) for r in trials if r.get("status") == "ok" and (v := _number(r.get("val_score"))) is not None]
        higher = str(trials[0].get("higher_is_better", "true")).lower() != "false"
        best = None
        for value, r in scored:
            if best is None or (value > best[0] if higher else value < best[0]):
                best = (value, r)
        chosen = best[1] if best else {}
        out.append({"study": name, "model": trials[0].get("model"), "dataset": trials[0].get("dataset"),
                    "trials": len({r.get("trial") for r in trials}), "ok": len(scored),
                    "best_trial": chosen.get("trial"), "val_score": best[0] if best else None,
                    "test_score": _number(chosen.get("test_score")),
                    "values": " ".join(searched_values(trials).get(chosen.get("run_id"), [])) if best else "",
                    "run_id": chosen.get("run_id"), "metric": trials[0].get("metric") or "score",
                    "higher_is_better": higher})
    return out


def display(table: list[dict]) -> list[list[str]]:
    return [[r["study"], r["model"] or DASH, r["dataset"] or DASH, str(r["trials"]), str(r["ok"]),
             DASH if r["best_trial"] is None else str(r["best_trial"]), fixed(r["val_score"]),
             fixed(r["test_score"]), r["values"] or DASH] for r in table]


def header(path: Path, used: list[dict], table: list[dict], command: str) -> list[str]:
    metrics = sorted({f"{r['metric']} ({'higher' if r['higher_is_better'] else 'lower'} is better)" for r in table})
    pruned = sum(r.get("status") == "pruned" for r in used)
    return [f"the best trial of each study: its validation {', '.join(metrics)} selects (val); the test score of "
            "that trial (test) is reported, never used to choose; values: what the search chose",
            confirmed.selection_line(confirmed.confirmations(used))
            + (f"; {pruned} trial(s) pruned by the median pruner (status pruned)" if pruned else ""),
            records_line(path, used), f"report: `{command}`" + made_by()]


def notes(table: list[dict]) -> list[str]:
    empty = [r["study"] for r in table if r["best_trial"] is None]
    return [f"No ok trial (a gap, never a 0): {', '.join(empty)}."] if empty else []


def write_study_report(name: str, cfg, path: Path, rows: list[dict], opts: dict, overrides: list[str],
                       out_dir: Path, found: bool = False) -> None:
    """`attnbench report NAME` of a search (``report.kind: study``): print and write ``<out>/<NAME>.md``
    and ``.csv``. ``found``: the records file was found by the command (its rerun does not name it)."""
    from bench_cli.core.errors import UserError
    from bench_cli.core.files import write_atomically
    from bench_cli.core.ui import console

    if opts["format"]:
        raise UserError(f"--format: {name} is a search; its report is Markdown and CSV")
    table = best_trials(rows)
    if not table:
        raise UserError(f"no trial of a study in the records of {name} ({path}): run `attnbench sweep experiment={name}`")
    screen = render.sized(console, opts["width"])
    title = str(cfg.report.get("title") or name)
    lines = header(path, [r for r in rows if r.get("study")], table, rerun_command(name, None if found else path, out_dir, opts, overrides))
    render.print_table(screen, title, lines, display(table), notes(table), COLUMNS)
    confirmations = confirmed.confirmations(rows)
    sections = [(confirmed.SECTION, confirmed.display(confirmations), confirmed.COLUMNS)] if confirmations else []
    for subtitle, shown, section_cols in sections:
        render.print_table(screen, f"{title}: {subtitle}", [], shown, [], section_cols)
    if opts["write"]:
        out = out_dir / name
        out.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(out.with_suffix(".md"), render.markdown(title, lines, display(table), notes(table), COLUMNS,
                                                                 sections))
        csv_store.write_rows(out.with_suffix(".csv"), [{k: csv_value(r[k]) for k in CSV_COLUMNS} for r in table],
                           CSV_COLUMNS, append=False)
        render.print_lines(screen, [f"wrote {out.with_suffix('.md')}, {out.with_suffix('.csv')}"])
