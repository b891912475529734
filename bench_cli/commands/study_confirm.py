"""The best settings of an Optuna study confirmed over several seeds (``tuning.confirm_top: K``,
``tuning.confirm_seeds: [...]``; docs/tuning.md).

A search ranks its trials by one seed's validation score: on a small validation split many trials
tie or differ by one sample, and the best of many noisy values is biased upwards (the winner's
curse). So after a study's trials, its best K complete trials are run again with each of the
confirmation seeds (jobs of the sweep like any other: claims, checkpoints, one record each, with
``study`` and ``confirms_trial``; a seed the trial already ran is its own record), and the setting
with the best mean validation score over the seeds is the one the study selects; the report shows
each confirmed setting's mean ± std over the seeds (bench_cli/results/report/confirmed.py).
"""
from __future__ import annotations

import statistics

from omegaconf import OmegaConf

from bench_cli.commands import sweep as sweep_command
from bench_cli.core.errors import UserError
from bench_cli.results import csv_store
from bench_cli.results.job_records import latest_ok_per_job


def confirmation(cfg) -> tuple[int, list[int]]:
    """(K, seeds) of ``tuning.confirm_top`` and ``tuning.confirm_seeds``; (0, []) when not asked."""
    top = int(OmegaConf.select(cfg, "tuning.confirm_top", default=0) or 0)
    seeds = OmegaConf.select(cfg, "tuning.confirm_seeds", default=None) or []
    try:
        seeds = [int(s) for s in seeds]
    except (TypeError, ValueError):
        raise UserError(f"tuning.confirm_seeds={seeds}: expected a list of seeds, e.g. [0,1,2]") from None
    if top and not seeds:
        raise UserError(f"tuning.confirm_top={top}: give the seeds to confirm with, e.g. tuning.confirm_seeds=[0,1,2]")
    return top, seeds


def best_complete(study, top: int, direction: str) -> list:
    """The ``top`` complete trials of ``study`` with the best values (ties: the earlier trial)."""
    complete = [t for t in study.trials if t.state.name == "COMPLETE"]
    sign = -1 if direction == "maximize" else 1
    return sorted(complete, key=lambda t: (sign * t.value, t.number))[:top]


def confirmation_jobs(s, trials: list, space: dict, seeds: list[int]) -> list[sweep_command.Job]:
    """One job per (trial, seed): the study's overrides, the trial's values, the seed."""
    base = [o for o in s.base.overrides if o.split("=", 1)[0].lstrip("+~") != "seed"]
    jobs = []
    for t in trials:
        values = [f"{k}={t.params[k]}" for k in space if k in t.params]
        for seed in seeds:
            job = sweep_command.plan_job(s.base.composer, [*base, *values, f"seed={seed}"])
            job.swept = s.base.swept | frozenset(k.lstrip("+~") for k in space) | {"seed"}
            job.position, job.columns = len(jobs), {"study": s.name, "confirms_trial": t.number}
            jobs.append(job)
    return jobs


def confirm_best(sweep: sweep_command.Sweep, s, study, space: dict, launched: int) -> int:
    """Run the confirmation of study ``s`` (``tuning.confirm_top``); print each confirmed setting's
    mean validation score over the seeds and the one selected; the jobs launched so far."""
    from rich.markup import escape

    from bench_cli.core.ui import console

    with s.base.reading() as cfg:
        top, seeds = confirmation(cfg)
    trials = best_complete(study, top, s.direction) if top else []
    if not trials:
        return launched
    jobs = confirmation_jobs(s, trials, space, seeds)
    done = sweep_command.done_keys(s.base.records_path)
    todo = [j for j in jobs if j.key not in done]
    console.print(f"[bold]confirm[/] {escape(s.name)}: the best {len(trials)} trial(s) over seeds "
                  f"{' '.join(map(str, seeds))}: {len(jobs)} jobs, {len(jobs) - len(todo)} done", highlight=False,
                  soft_wrap=True)
    if todo:
        sweep_command.validate_jobs(todo)
        sweep_command.launch(sweep_command.Sweep(sweep.master, todo, sweep.flags, total=len(jobs)), todo,
                             first_job_idx=launched)
    latest = latest_ok_per_job(csv_store.read_records(s.base.records_path))
    means = {}
    for t in trials:
        values = [float(latest[j.key]["val_score"]) for j in jobs
                  if j.columns["confirms_trial"] == t.number and j.key in latest and latest[j.key].get("val_score")]
        means[t.number] = values
    scored = {n: statistics.fmean(v) for n, v in means.items() if v}
    if scored:
        chosen = (max if s.direction == "maximize" else min)(scored, key=lambda n: (scored[n], -n))
        shown = ", ".join(f"trial {n} {statistics.fmean(v):.4g}" + (f" ± {statistics.stdev(v):.2g}" if len(v) > 1 else "")
                          + f" (n {len(v)})" for n, v in means.items() if v)
        console.print(f"[bold]confirmed[/] {escape(s.name)}: validation {s.metric} over seeds: {escape(shown)}; "
                      f"selected: trial {chosen}", highlight=False, soft_wrap=True)
    return launched + len(todo)
