"""What runs in a launcher's worker for each job of a sweep (the basic launcher's is the sweep
process itself; joblib's a local worker; Slurm's a job on a node): ``run_planned_job``, the task
function the launcher is handed with the plan (``functools.partial``, pickled by its module path:
this module must stay importable as ``bench_cli.commands.sweep.job``).

A launcher composes each job again where it runs it; the job checks that its config has the
planned ``job_key`` before it runs (a mismatch is an error that names both keys), claims the job in
its records file under its lock (``claims.claim_job``: a job another live process has claimed, or
that got an ``ok`` record since the plan, is skipped with one line, ``skipped, running in pid N``;
the claim of a process that is gone, kill -9, is taken over), trains and records it. A job that
crashes, diverges (NaN loss) or runs out of memory is recorded by the runner with its status and
error, and the sweep goes on.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from bench_cli.commands.sweep import stop
from bench_cli.commands.sweep.plan import job_label
from bench_cli.config import plugins
from bench_cli.core.errors import UserError, catch_termination, interruption_name
from bench_cli.results import claims, job_keys


class PlanMismatchError(RuntimeError):
    """A launcher composed a job to another config than the plan did."""


@dataclass(frozen=True)
class JobPlan:
    """What each launched job gets of the plan (pickled to the launcher's worker processes)."""
    keys: dict  # the job's task overrides (tuple) -> (position in the plan, planned job_key)
    total: int
    sweep_pid: int
    # records file -> the row from which an ok row of a job means another process ran it: 0 (any
    # ok row), or with --force the number of rows when the sweep started (those are rerun)
    ok_rows_from: dict = field(default_factory=dict)
    swept: frozenset = frozenset()  # the keys that vary between the sweep's jobs (their labels show them)
    live_line: bool = False  # the sweep draws its progress on a live terminal line (progress.SweepProgress)
    columns: dict = field(default_factory=dict)  # job_key -> record columns its config does not say (Job.columns)

    def check(self, overrides: tuple[str, ...], cfg: DictConfig) -> int:
        """The job's position in the plan, after checking that ``cfg`` is the planned config."""
        if overrides not in self.keys:
            raise PlanMismatchError(f"job '{' '.join(overrides)}' is not in the sweep's plan; nothing was run")
        position, planned = self.keys[overrides]
        key = job_keys.job_key(cfg)
        if key != planned:
            raise PlanMismatchError(f"job '{' '.join(overrides)}': the launcher composed a config with job_key {key}, "
                                    f"the plan has {planned}: conf/ or the environment differs between the sweep "
                                    "and the process that runs the job; nothing was run")
        return position


def _threads_for_launcher(cfg) -> int | None:
    """Intra-op threads when jobs run side by side: cores / parallel jobs (trainer.num_threads wins)."""
    if cfg.trainer.get("num_threads"):
        return int(cfg.trainer.num_threads)
    try:
        launcher = HydraConfig.get().launcher
    except ValueError:
        return None
    n_jobs = launcher.get("n_jobs") if "n_jobs" in launcher else None
    if n_jobs is None:
        return None
    cores = os.cpu_count() or 1
    workers = int(n_jobs) if int(n_jobs) > 0 else max(1, cores + 1 + int(n_jobs))
    return max(1, cores // max(workers, 1))


_WATCHING = False


def die_with_sweep(sweep_pid: int) -> None:
    """In a local worker process of the sweep (joblib/loky), exit as soon as the sweep process is
    gone: a sweep killed with kill -9 must not leave workers that finish their jobs and then idle.
    Only direct children of the sweep process watch it (the basic launcher runs jobs in the sweep
    process itself; Slurm/submitit jobs are meant to outlive their submitter)."""
    global _WATCHING
    if _WATCHING or not sweep_pid or os.getpid() == sweep_pid or os.getppid() != sweep_pid:
        return
    import threading

    def watch():
        while os.getppid() == sweep_pid:  # re-parented when the sweep process dies
            time.sleep(1.0)
        os._exit(1)

    threading.Thread(target=watch, name="attnbench-die-with-sweep", daemon=True).start()
    _WATCHING = True


def run_planned_job(cfg: DictConfig, plan: JobPlan) -> str:
    """The task function the launcher runs for each job (``functools.partial`` with the plan):
    check the config against the plan, claim the job in its records file, train, record, print
    the job's line."""
    import torch

    die_with_sweep(plan.sweep_pid)
    if stop.stopping(plan.sweep_pid):  # the sweep was interrupted before this job started
        return "not started"
    catch_termination()  # a worker process SIGTERMed (Slurm, joblib) records its job as interrupted
    plugins.import_plugins()  # the sweep's plugins in this process too (joblib worker, Slurm job): once each
    plugins.import_configured(cfg)
    hc = HydraConfig.get()
    overrides = tuple(hc.overrides.task)
    position = plan.check(overrides, cfg)
    head, key = job_line_head(position, plan.total), plan.keys[overrides][1]
    label = job_label(cfg, overrides, plan.swept)
    say = job_printer(plan)
    claimed = claim(cfg, key, plan, head, label, say)
    if claimed is False:
        return "skipped"
    threads = _threads_for_launcher(cfg)
    if threads:
        torch.set_num_threads(threads)
    try:
        columns = plan.columns.get(key)
        if not claimed:  # a job of several processes: not claimed
            return _train_and_print_outcome(cfg, hc, position, plan.total, head, label, say, columns)
        with claims.heartbeat(str(cfg.results.path), key):  # the claim stays fresh however long the job runs
            return _train_and_print_outcome(cfg, hc, position, plan.total, head, label, say, columns)
    except KeyboardInterrupt as e:  # recorded by the runner; in the sweep's own process it stops the sweep
        if os.getpid() == plan.sweep_pid:
            raise
        say(f"{head} [red]interrupted[/] ({interruption_name(e)}) {label}: the same sweep command resumes it "
            "from its checkpoint")
        return "interrupted"
    finally:
        if claimed:
            claims.release_job(str(cfg.results.path), key)


def job_printer(plan: JobPlan):
    """``say(text)``: a job's line (rich markup) on the console; in another process than the
    sweep's, writing to the terminal where the sweep draws its live line, that line is cleared
    first (progress.clear_live_line)."""
    from bench_cli.commands.sweep.progress import clear_live_line
    from bench_cli.core.ui import console

    clear = plan.live_line and os.getpid() != plan.sweep_pid and console.is_terminal

    def say(text: str) -> None:
        with console:  # one write: the clearing and the line
            if clear:
                clear_live_line(console)
            console.print(text, highlight=False, soft_wrap=True)

    return say


def claim(cfg: DictConfig, key: str, plan: JobPlan, head: str, label: str, say) -> bool | None:
    """Claim the job in its records file before it runs (claims.claim_job), so that another sweep
    of the same file skips it: False when another process ran it or runs it now (said in one
    line), None for a job of several processes (torchrun, Slurm tasks: each runs it; not claimed)."""
    from rich.markup import escape

    from bench_cli.engine.distributed import launch_env

    env = launch_env()
    if env is not None and env.world_size > 1:
        return None
    path = str(cfg.results.path)
    claimed, note = claims.claim_job(path, key, plan.ok_rows_from.get(path, 0), claims.claim_ttl(cfg))
    if not claimed:
        say(f"{head} [yellow]skipped[/], {escape(note)}: {label}")
    elif note:
        say(f"{head} {escape(note)}: {label}")
    return claimed


def _train_and_print_outcome(cfg: DictConfig, hc, position: int, total: int, head: str, label: str, say,
                             columns: dict | None = None) -> str:
    """Train and record the job (``columns``: JobPlan.columns); print its start line and its
    outcome line (``say``); its status."""
    from rich.markup import escape

    from bench_cli.engine.runner import run_experiment
    from bench_cli.core.ui import metric_digits

    say(f"{head} [cyan]start[/]   {label}")
    t0 = time.perf_counter()
    try:
        outcome = run_experiment(cfg, Path(hc.runtime.output_dir), progress=None, overrides=list(hc.overrides.task),
                                 line_prefix=f"[sweep {position + 1}/{total}] {label}: ", columns=columns)
    except UserError as e:  # recorded by the runner; the sweep goes on
        say(f"{head} [red]failed[/]  {label}: {escape(str(e))}")
        return "failed"
    row = outcome.record
    if outcome.rank:  # another process of a distributed job: rank 0 reports
        return row["status"]
    value = row.get("test_score")
    shown = (f"test {row['metric']} {float(value):.{metric_digits(value)}f}" if isinstance(value, (int, float))
             else escape(str(row.get("error", ""))))
    style = "green" if row["status"] == "ok" else "red"
    say(f"{head} [{style}]{row['status']:<7}[/] {label}  {shown}  ({time.perf_counter() - t0:.0f} s)")
    return row["status"]


def job_line_head(position: int, total: int) -> str:
    """'[sweep  3/12]': how a job's lines start, the position padded to the width of the total."""
    from rich.markup import escape

    return escape(f"[sweep {position + 1:>{len(str(total))}}/{total}]")
