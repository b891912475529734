"""`attnbench sweep`: a grid of runs through Hydra's multirun machinery, resumable, failure tolerant.

The grid is the experiment's ``hydra.sweeper.params`` plus sweeps on the command line
(``model=softmax,attention_bn seed=0,1``); the command line wins for the same key, as in Hydra.
This module is the command (its options, then plan, check, launch, summarise); its parts:

- ``plan``: the jobs, each composed as its launcher will compose it and keyed by ``job_keys.job_key``;
- ``checks``: what is refused before anything runs (a config mistake, missing data, an impossible
  (task, model) pair: one line, exit 2) and what is only noted (a GPU this machine lacks);
- ``launch``: the jobs handed to the config's launcher, in batches, as Hydra's multirun does;
- ``job``: what runs in the launcher's worker for each job (checked against the plan, claimed,
  trained, recorded);
- ``progress``: jobs done / failed / running / to go with a time left, read from the records and
  claims the jobs write whichever process runs them (docs/progress.md);
- ``summary``: the dry run's table and the summary after the sweep.

Resume: a job whose result record (``results.path``) already holds an ``ok`` row with the same
``job_key`` (hash of the resolved config, seed included) is skipped by the plan; missing and
failed jobs are handed to the launcher of the config. ``--force`` reruns everything.

Two sweeps of one records file at once: each job is claimed in the records file under its lock
before it runs; a job another live process has claimed is skipped with one line (``job``). A dry
run lists every job, marking those whose data is missing (of those to run: a finished job needs
neither its data nor its model built); a real sweep refuses them in one line.

Failures: a job that crashes, diverges (NaN loss) or runs out of memory is recorded by the runner
with its status and error and the sweep goes on. The exit status is the number of jobs of the grid
without an ``ok`` record after the sweep (capped at 125), not counting those another process is
still running; 0 when all are ok.

Search: with ``hydra/sweeper=optuna`` the grid's jobs are studies and their trials the jobs that
run (bench_cli/commands/study.py; docs/tuning.md), planned, claimed and recorded as above.
"""
from __future__ import annotations

import time

import hydra
from omegaconf import DictConfig, OmegaConf

from bench_cli.commands.sweep.checks import (check_data_first, check_launcher_reachable, lacking_here,
                                             skip_incapable, validate_jobs)
from bench_cli.commands.sweep.job import JobPlan, PlanMismatchError, job_line_head
from bench_cli.commands.sweep.launch import error_of, launch, start_launching
from bench_cli.commands.sweep.plan import (Job, Sweep, done_keys, expand_grid, is_search, job_overrides, plan_job,
                                           plan_sweep, split_search, sweep_lines)
from bench_cli.commands.sweep import stop
from bench_cli.commands.sweep.summary import print_lacking, print_plan, summarize
from bench_cli.config import compose
from bench_cli.config.args import parse
from bench_cli.core.errors import UserError, exit_code_of, interruption_name
from bench_cli.results import claims, code_identity, csv_store

__all__ = [  # what the CLI, the Optuna search (study.py) and the tests use
    "USAGE", "MAX_EXIT", "plan_command", "run_grid", "run_sweep",
    "Job", "Sweep", "plan_sweep", "plan_job", "expand_grid", "job_overrides", "is_search", "split_search",
    "sweep_lines", "done_keys", "validate_jobs", "skip_incapable", "launch", "start_launching", "error_of",
    "JobPlan", "PlanMismatchError",
]

USAGE = """\
usage: attnbench sweep [--force] [--dry-run] [overrides...]

Runs the grid of an experiment (its hydra.sweeper.params) and/or of sweeps given here, one record
per job in results/runs.csv. Rerunning the same command skips the jobs that already have an ok
record and runs only what is missing or failed.

  attnbench sweep experiment=primal_dual/table1
  attnbench sweep experiment=primal_dual/table1 task.dataset=JapaneseVowels,BasicMotions
  attnbench sweep experiment=primal_dual/table1 hydra/launcher=joblib hydra.launcher.n_jobs=2
  attnbench sweep experiment=primal_dual/table1 hydra/launcher=joblib_cpu   # conf/hydra/launcher
  attnbench sweep experiment=primal_dual/table1 hydra/launcher=submitit_slurm
  attnbench sweep model=softmax,attention_bn seed=0,1 trainer.max_epochs=5
  attnbench sweep experiment=tuning/uea_lr_dropout   # hydra/sweeper=optuna: a search per model (docs/tuning.md)

options:
  --force     rerun jobs that already have an ok record
  --dry-run   list the jobs, whether each is done and whether its data is here; run nothing
  Hydra's --config-dir DIR (and --config-name, --config-path) are used by the plan and the jobs;
  Hydra's --cfg job, --info and --hydra-help print and run nothing

exit status: 0 when every job of the grid has an ok record; otherwise the number of jobs that
failed (status failed / nan / oom, or no record), at most 125; 2 for a usage error.
"""

SWEEP_OPTIONS = {"--force": False, "--dry-run": False, "-h": False, "--help": False}
# Hydra's flags that print something and run nothing (handed to Hydra), and those that say where
# the configs are (used by the plan and the launch alike).
HYDRA_SHOW_FLAGS = {"--hydra-help", "--info", "-i", "--cfg", "-c", "--version", "--shell-completion", "-sc"}
HYDRA_SEARCH_FLAGS = {"--config-dir", "-cd", "--config-name", "-cn", "--config-path", "-cp"}
MAX_EXIT = 125


# Defined here, in the package's own module: Hydra names the job after the module of its
# ``@hydra.main`` function (hydra/_internal/utils.py ``detect_task_name``), and `attnbench sweep
# --cfg hydra` shows hydra.job.name: sweep, the name the launched jobs have too (plan.JOB_NAME).
@hydra.main(version_base=compose.HYDRA_VERSION_BASE, config_path="pkg://attnbench.conf", config_name=compose.CONFIG_NAME)
def _hydra_sweep_flags(cfg: DictConfig) -> None:
    """Only for Hydra's own flags (--cfg, --info, --hydra-help): nothing is run through it."""
    raise SystemExit("attnbench sweep: internal error: the Hydra entry point only serves Hydra's flags")


def parse_sweep_args(args: list[str]):
    """(parsed arguments, Hydra's search-path flags); Hydra's flags that print are handed to Hydra
    (None is returned then)."""
    p = parse("sweep", args, SWEEP_OPTIONS, hydra=True, positional=False)
    flags = {k: v for k, v in p.hydra.items() if k not in ("-m", "--multirun")}  # a sweep is a multirun
    if HYDRA_SHOW_FLAGS & set(flags):
        compose.dispatch_to_hydra(_hydra_sweep_flags, [a for a in p.hydra_args if a not in ("-m", "--multirun")]
                                  + p.overrides)
        return None
    other = sorted(set(flags) - HYDRA_SEARCH_FLAGS)
    if other:
        raise UserError(f"Hydra's {other[0]} does not apply to `attnbench sweep`; it takes --force, --dry-run, "
                        f"Hydra's --config-dir, --config-name, --config-path, and prints with --cfg job or --info")
    return p, flags


def plan_command(args: list[str]) -> tuple[Sweep, bool, bool] | None:
    """`attnbench sweep ARGS` planned: (the sweep, --force, --dry-run); None when there is nothing
    to run (--help, Hydra's printing flags). The CLI then runs it: a grid (``run_grid``) or, with
    hydra/sweeper=optuna, a study per job (bench_cli/commands/study.py)."""
    from rich.markup import escape

    from bench_cli.core.ui import console

    if any(a in ("-h", "--help") for a in args):
        from bench_cli.core.ui import usage_text

        print(usage_text(USAGE))
        return None
    parsed = parse_sweep_args(args)
    if parsed is None:
        return None
    p, flags = parsed
    force, dry_run = bool(p.get("--force")), bool(p.get("--dry-run"))
    if not dry_run:  # a dry run lists every job, data or not
        check_data_first(p.overrides, flags)
    sweep = plan_sweep(p.overrides, flags, progress=True)
    sweep.jobs, skipped = skip_incapable(sweep.jobs)
    for reason in dict.fromkeys(reason for _, reason in skipped):
        console.print(f"[yellow]skipped[/] ({sum(r == reason for _, r in skipped)} jobs): {escape(reason)}",
                      highlight=False, soft_wrap=True)
    if not sweep.jobs:
        raise UserError("the sweep has no jobs")
    return sweep, force, dry_run


def run_grid(sweep: Sweep, force: bool, dry_run: bool) -> None:
    """The planned grid's jobs without an ok record (every job with ``force``), or with ``dry_run``
    the plan printed; exits with the number of failed jobs (at most MAX_EXIT)."""
    from rich.markup import escape

    from bench_cli.core.ui import console

    jobs = sweep.jobs
    paths = {j.records_path for j in jobs}
    done = {}
    for path in paths:
        done.update(done_keys(path))
    stale = code_identity.stale_jobs([done[j.key] for j in jobs if j.key in done])  # a plugin changed since: to run
    done = {k: r for k, r in done.items() if k not in stale}
    n_done = sum(j.key in done for j in jobs)
    todo = jobs if force else [j for j in jobs if j.key not in done]
    # the jobs that will run (a done job needs neither its data nor its model built: a resumed
    # sweep starts at once); a dry run lists every job, data or not
    missing = validate_jobs(todo, missing_data_ok=dry_run)
    what = OmegaConf.select(jobs[0].cfg, "experiment_name", default=None) or "sweep"
    console.print(f"[bold]{what}[/]: {len(jobs)} jobs, {n_done} already done"
                  + (" (rerun: --force)" if force and n_done else "")
                  + f", {len(todo)} to run; records: {', '.join(sorted(paths))}", soft_wrap=True)
    print_lacking(lacking_here(todo), len(todo))
    for reason in dict.fromkeys(stale.values()):
        console.print(f"{sum(r == reason for r in stale.values())} jobs to run again: {escape(reason)}", soft_wrap=True)
    if dry_run:
        claimed = {}
        for path in paths:
            claimed.update(claims.claimed_jobs(path, [j.key for j in jobs], claims.claim_ttl(jobs[0].cfg)))
        print_plan(jobs, done, force, missing, claimed, stale)
        return
    if not todo:
        console.print("[green]nothing to do[/]: every job has an ok record (use --force to rerun)")
        return
    for i, job in enumerate(jobs):
        if not force and job.key in done:
            console.print(f"{job_line_head(i, len(jobs))} [dim]skip[/]    {job.label}  "
                          f"(ok record {done[job.key].get('run_id', '')})", highlight=False, soft_wrap=True)
    check_launcher_reachable(sweep.master)
    n_failed = run_sweep(sweep, todo, paths, done if not force else {}, force=force)
    if n_failed:
        raise SystemExit(min(n_failed, MAX_EXIT))


def run_sweep(sweep: Sweep, todo: list[Job], paths: set[str], done_before: dict, force: bool = False) -> int:
    """Launch ``todo``, then summarise; the number of jobs without an ok record (those another
    process runs at the end are not counted)."""
    from rich.markup import escape

    from bench_cli.commands.sweep.progress import SweepProgress
    from bench_cli.core.ui import console

    before = {p: len(csv_store.read_records(p)) for p in paths}
    started = time.perf_counter()
    start_launching()
    try:
        ttl = claims.claim_ttl(todo[0].cfg)
        with SweepProgress([(j.key, j.records_path) for j in todo], before, ttl) as progress, \
                stop.stopping_jobs_with_the_sweep(paths, [j.key for j in todo], ttl, console.print):
            returns = launch(sweep, todo, before if force else None, live_line=progress.live)
    except KeyboardInterrupt as e:
        summarize(sweep.jobs, paths, before, done_before, time.perf_counter() - started)
        console.print(f"[red]interrupted[/] ({interruption_name(e)}): rerun the same command to run only the "
                      "missing and failed jobs")
        raise SystemExit(exit_code_of(e)) from None
    errors = [e for e in map(error_of, returns) if e is not None]
    for e in errors:  # a job that failed outside its run (the run records its own failures)
        console.print(f"[bold red]error:[/] {escape(type(e).__name__)}: {escape(str(e))}", highlight=False,
                      soft_wrap=True)
    n_failed = summarize(sweep.jobs, paths, before, done_before, time.perf_counter() - started)
    return max(n_failed, 1) if errors else n_failed
