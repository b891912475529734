"""`attnbench sweep`: a grid of runs through Hydra's multirun, resumable, failure tolerant.

The grid is the experiment's ``hydra.sweeper.params`` plus sweeps on the command line
(``model=softmax,attention_bn seed=0,1``); the command line wins for the same key, as in Hydra.
The sweep dispatches to a ``@hydra.main`` function (``sys.argv`` rewritten, ``--multirun``), so
the basic launcher, ``hydra/launcher=joblib`` (local processes) and ``hydra/launcher=submitit_slurm``
all work, and so do the launcher configs shipped in ``conf/hydra/launcher/``.

Before anything runs the grid is expanded and every job composed with the compose API: a mistake
in any job's config, a missing dataset or an impossible (task, model) pair is one line, exit 2.

Resume: a job whose result record (``results.path``) already holds an ``ok`` row with the same
``job_key`` (hash of the resolved config, seed included) is skipped; missing and failed jobs run.
``--force`` reruns everything. The check happens inside each job, so it holds for every launcher.

Failures: a job that crashes, diverges (NaN loss) or runs out of memory is recorded by the runner
with its status and error and the sweep goes on. The exit status is the number of jobs of the grid
without an ``ok`` record after the sweep (capped at 125); 0 when all are ok.
"""
from __future__ import annotations

import itertools
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from bench_cli import compose as C
from bench_cli import records
from bench_cli.errors import DataNotFoundError, UserError, catch_termination, exit_code_of, interruption_name

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

options:
  --force     rerun jobs that already have an ok record
  --dry-run   list the jobs and whether each is done, run nothing

exit status: 0 when every job of the grid has an ok record; otherwise the number of jobs that
failed (status failed / nan / oom, or no record), at most 125; 2 for a usage error.
"""

FORCE_ENV = "ATTNBENCH_SWEEP_FORCE"
SWEEP_PID_ENV = "ATTNBENCH_SWEEP_PID"
TOTAL_ENV = "ATTNBENCH_SWEEP_TOTAL"
MAX_EXIT = 125


@dataclass
class Job:
    overrides: list[str]
    cfg: DictConfig = field(repr=False)
    key: str = ""

    @property
    def label(self) -> str:
        return job_label(self.cfg)


def job_label(cfg) -> str:
    ds = OmegaConf.select(cfg, "task.dataset", default=None)
    return f"{cfg.task.name}/{ds or '-'} {cfg.model.name} seed={cfg.seed}"


# --- the grid ---------------------------------------------------------------------------------
def _values(o) -> list[str]:
    key = o.get_key_element()
    if o.is_sweep_override():
        return [f"{key}={v}" for v in o.sweep_string_iterator()]
    return [f"{key}={o.get_value_element_as_str()}"]


def expand_grid(overrides: list[str]) -> list[list[str]]:
    """Override lists of every job, in Hydra's BasicSweeper order (config params first, then the
    command line; the command line replaces a config param of the same key)."""
    parsed = C.parse_overrides(overrides)
    hydra_ovs = [o.input_line for o in parsed if o.key_or_group.startswith("hydra")]
    fixed = [o.input_line for o in parsed if not o.key_or_group.startswith("hydra") and not o.is_sweep_override()]
    master = C.compose_unchecked(fixed + hydra_ovs, with_hydra=True)
    params = OmegaConf.select(master, "hydra.sweeper.params", default=None)
    params = OmegaConf.to_container(params, resolve=False) if params is not None else {}
    lines = [f"{k}={v}" for k, v in params.items()]
    axes: dict[str, list[str]] = {}
    for o in C.parse_overrides(lines) + [o for o in parsed if not o.key_or_group.startswith("hydra")]:
        axes[o.get_key_element()] = _values(o)
    return [list(combo) for combo in itertools.product(*axes.values())]


def _is_structural(o) -> bool:
    """An override that changes which config files are composed (a group choice, a hydra key, a
    deletion), as opposed to setting a value."""
    key = o.key_or_group
    return (key.startswith("hydra") or o.is_delete() or "/" in key or "@" in key
            or (C.conf_dir() / key).is_dir())


def _apply_value(cfg: DictConfig, o) -> None:
    """What Hydra does with a value override after composing (``key=v``, ``+key=v``, ``++key=v``);
    KeyError where Hydra would refuse (the caller then lets Hydra say why)."""
    key, exists = o.key_or_group, _has_key(cfg, o.key_or_group)
    if (o.is_add() and exists) or (not o.is_add() and not o.is_force_add() and not exists):
        raise KeyError(key)
    OmegaConf.update(cfg, key, o.value(), merge=True, force_add=o.is_add() or o.is_force_add())


def _has_key(cfg, key: str) -> bool:
    parent, _, leaf = key.rpartition(".")
    node = OmegaConf.select(cfg, parent) if parent else cfg
    return isinstance(node, DictConfig) and leaf in node


def compose_jobs(grid: list[list[str]]) -> list[Job]:
    """Compose every job. Jobs that differ only in values (seed, task.dataset, trainer.*) share one
    Hydra composition of their group choices, then get their values set as Hydra sets them; anything
    unusual falls back to a full composition. Errors name the job."""
    import copy

    if grid:
        C.check_group_choices(grid[0])
        C.check_value_types(C.compose_unchecked(grid[0]), grid[0])
    jobs, bases = [], {}
    with C.composer() as full:
        for ovs in grid:
            C.check_group_choices(ovs)
            parsed = C.parse_overrides(ovs)
            structural = tuple(o.input_line for o in parsed if _is_structural(o))
            if structural not in bases:
                bases[structural] = full(list(structural))
            cfg = copy.deepcopy(bases[structural])
            try:
                for o in parsed:
                    if not _is_structural(o):
                        _apply_value(cfg, o)
            except Exception:  # noqa: BLE001 - let Hydra produce its own error or result
                cfg = full(ovs)
            try:
                key = records.job_key(cfg)
            except Exception as e:  # noqa: BLE001 - an interpolation that does not resolve
                raise UserError(f"job '{' '.join(ovs)}': cannot resolve its config: "
                                f"{str(e).splitlines()[0]}") from None
            jobs.append(Job(ovs, cfg, key))
    return jobs


def validate_jobs(jobs: list[Job]) -> None:
    """bench_cli.validate on every job: settings, data present, model fits the task (once per
    distinct (task, dataset, model)), model builds (once per distinct task and model config)."""
    from bench_cli.validate import check_config, check_model_builds

    seen_data, seen_model = set(), set()
    missing, present = [], []
    for job in jobs:
        cfg = job.cfg
        data_id = (cfg.task.name, OmegaConf.select(cfg, "task.dataset", default=None), cfg.model.name)
        try:
            if data_id in seen_data:
                continue
            seen_data.add(data_id)
            task = check_config(cfg)
            present.append(data_id[1])
            model_id = json.dumps([OmegaConf.to_container(cfg.task, resolve=True),
                                   OmegaConf.to_container(cfg.model, resolve=True)], sort_keys=True, default=str)
            if model_id not in seen_model:
                seen_model.add(model_id)
                check_model_builds(task, cfg)
        except DataNotFoundError as e:
            missing.append(str(e))
        except UserError as e:
            raise UserError(f"job '{' '.join(job.overrides)}': {e}") from None
    if missing:
        uniq = list(dict.fromkeys(missing))
        more = f" (and {len(uniq) - 1} more datasets)" if len(uniq) > 1 else ""
        here = sorted({str(d) for d in present if d is not None})
        hint = f"; or restrict the dataset axis to what is here: task.dataset={','.join(here)}" if here else ""
        raise UserError(f"{uniq[0]}{more}{hint}")


def done_keys(path) -> dict[str, dict]:
    """job_key -> latest ok record."""
    return {r["job_key"]: r for r in records.read_records(path) if r.get("status") == "ok" and r.get("job_key")}


def plan(overrides: list[str]) -> list[Job]:
    C.check_group_choices(overrides, allow_sweep=True)
    jobs = compose_jobs(expand_grid(overrides))
    seen, unique = set(), []
    for j in jobs:  # a grid can name the same config twice (e.g. seed=0,0)
        if j.key not in seen:
            seen.add(j.key)
            unique.append(j)
    return unique


# --- the job, run by the launcher -------------------------------------------------------------
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


def die_with_sweep() -> None:
    """In a local worker process of the sweep (joblib/loky), exit as soon as the sweep process is
    gone: a sweep killed with kill -9 must not leave workers that finish their jobs and then idle.
    Only direct children of the sweep process watch it (the basic launcher runs jobs in the sweep
    process itself; Slurm/submitit jobs are meant to outlive their submitter)."""
    global _WATCHING
    sweep_pid = int(os.environ.get(SWEEP_PID_ENV, "0") or 0)
    if _WATCHING or not sweep_pid or os.getpid() == sweep_pid or os.getppid() != sweep_pid:
        return
    import threading

    def watch():
        while os.getppid() == sweep_pid:  # re-parented when the sweep process dies
            time.sleep(1.0)
        os._exit(1)

    threading.Thread(target=watch, name="attnbench-die-with-sweep", daemon=True).start()
    _WATCHING = True


@hydra.main(version_base="1.3", config_path="pkg://conf", config_name=C.CONFIG_NAME)
def _hydra_sweep_job(cfg: DictConfig) -> str:
    import torch
    from rich.markup import escape

    from bench_cli.runner import run_experiment
    from bench_cli.ui import console

    die_with_sweep()
    catch_termination()  # a worker process SIGTERMed (Slurm, joblib) records its job as interrupted
    hc = HydraConfig.get()
    num, total = int(hc.job.num) + 1, os.environ.get(TOTAL_ENV, "?")
    head = escape(f"[sweep {num:>{len(str(total))}}/{total}]")
    label = job_label(cfg)
    key = records.job_key(cfg)
    if not os.environ.get(FORCE_ENV):
        done = done_keys(cfg.results.path).get(key)
        if done is not None:
            console.print(f"{head} [dim]skip[/]    {label}  (ok record {done.get('run_id', '')})", highlight=False, soft_wrap=True)
            return "skipped"
    threads = _threads_for_launcher(cfg)
    if threads:
        torch.set_num_threads(threads)
    console.print(f"{head} [cyan]start[/]   {label}", highlight=False, soft_wrap=True)
    t0 = time.perf_counter()
    try:
        row = run_experiment(cfg, Path(hc.runtime.output_dir), progress=None, overrides=list(hc.overrides.task),
                             line_prefix=f"[sweep {num}/{total}] {label}: ")
    except UserError as e:  # recorded by the runner; the sweep goes on
        console.print(f"{head} [red]failed[/]  {label}: {escape(str(e))}", highlight=False, soft_wrap=True)
        return "failed"
    if row.get("_rank"):  # another process of a distributed job: rank 0 reports
        return row["status"]
    value = row.get("test_score")
    shown = (f"test {row['metric']} {float(value):.{_digits(value)}f}" if isinstance(value, (int, float))
             else escape(str(row.get("error", ""))))
    style = "green" if row["status"] == "ok" else "red"
    console.print(f"{head} [{style}]{row['status']:<7}[/] {label}  {shown}  ({time.perf_counter() - t0:.0f} s)",
                  highlight=False, soft_wrap=True)
    return row["status"]


def _digits(value: float) -> int:
    """Decimals that show a metric readably (accuracy 98.65, RMSE 0.0123)."""
    return 2 if abs(value) >= 1 else 4


# --- the command ------------------------------------------------------------------------------
def cmd_sweep(args: list[str]) -> None:
    from bench_cli.records import new_run_id
    from bench_cli.ui import console

    if any(a in ("-h", "--help") for a in args):
        print(USAGE)
        return
    force = "--force" in args
    dry_run = "--dry-run" in args
    args = [a for a in args if a not in ("--force", "--dry-run", "--multirun", "-m")]
    flags, overrides = C.split_args(args)
    if {"--hydra-help", "--info", "-i", "--cfg", "-c", "--version"} & set(flags):
        C.dispatch_to_hydra(_hydra_sweep_job, ["--multirun", *args])
        return
    unknown = [f for f in flags if f.startswith("--") and f not in ("--config-dir", "--config-name", "--config-path")]
    if unknown:
        raise UserError(f"unknown option '{unknown[0]}'; valid: --force, --dry-run (and Hydra's --cfg, --info)")

    jobs = plan(overrides)
    if not jobs:
        raise UserError("the sweep has no jobs")
    validate_jobs(jobs)
    paths = {str(j.cfg.results.path) for j in jobs}
    done = {}
    for p in paths:
        done.update(done_keys(p))
    n_done = sum(j.key in done for j in jobs)
    what = OmegaConf.select(jobs[0].cfg, "experiment_name", default=None) or "sweep"
    todo = len(jobs) if force else len(jobs) - n_done
    console.print(f"[bold]{what}[/]: {len(jobs)} jobs, {n_done} already done"
                  + (" (rerun: --force)" if force and n_done else "") + f", {todo} to run; records: {', '.join(sorted(paths))}",
                  soft_wrap=True)
    if dry_run:
        _print_plan(jobs, done, force)
        return
    if todo == 0:
        console.print("[green]nothing to do[/]: every job has an ok record (use --force to rerun)")
        return

    before = {p: len(records.read_records(p)) for p in paths}
    os.environ[TOTAL_ENV] = str(len(jobs))
    if force:
        os.environ[FORCE_ENV] = "1"
    hydra_failed = None
    started = time.perf_counter()
    os.environ["ATTNBENCH_RUN_ID"] = new_run_id()  # the sweep's folder
    os.environ[SWEEP_PID_ENV] = str(os.getpid())
    try:
        C.dispatch_to_hydra(_hydra_sweep_job, ["--multirun", *args])
    except SystemExit as e:  # Hydra reports a launcher/job error and exits; still summarise
        hydra_failed = e.code
    except KeyboardInterrupt as e:
        summarize(jobs, paths, before, done if not force else {}, time.perf_counter() - started)
        console.print(f"[red]interrupted[/] ({interruption_name(e)}): rerun the same command to run only the "
                      "missing and failed jobs")
        raise SystemExit(exit_code_of(e)) from None
    finally:
        os.environ.pop(FORCE_ENV, None)
    n_failed = summarize(jobs, paths, before, done if not force else {}, time.perf_counter() - started)
    if hydra_failed not in (None, 0) and n_failed == 0:
        n_failed = 1
    if n_failed:
        raise SystemExit(min(n_failed, MAX_EXIT))


def _print_plan(jobs: list[Job], done: dict, force: bool) -> None:
    from rich.table import Table

    from bench_cli.report import wide

    from bench_cli.ui import console

    t = Table(title="jobs")
    for col in ("#", "job", "job_key", "status"):
        t.add_column(col)
    for i, j in enumerate(jobs, 1):
        status = ("[yellow]rerun[/]" if force else "[dim]done, skip[/]") if j.key in done else "to run"
        t.add_row(str(i), j.label, j.key, status)
    wide(console, 120).print(t)


def outcomes(jobs: list[Job], paths, before: dict[str, int], done_before: dict) -> list[tuple[Job, str, dict | None]]:
    """(job, status, record) for every job: the status of its newest record written by this sweep,
    'skipped' when it was done before and not rerun, 'missing' when nothing was recorded."""
    new: dict[str, dict] = {}
    for p in paths:
        for r in records.read_records(p)[before.get(p, 0):]:
            new[r.get("job_key", "")] = r
    out = []
    for j in jobs:
        if j.key in new:
            out.append((j, new[j.key].get("status") or "failed", new[j.key]))
        elif j.key in done_before:
            out.append((j, "skipped", done_before[j.key]))
        else:
            out.append((j, "missing", None))
    return out


def summarize(jobs, paths, before, done_before, seconds: float) -> int:
    from rich.markup import escape
    from rich.table import Table

    from bench_cli.report import wide

    from bench_cli.ui import console

    res = outcomes(jobs, paths, before, done_before)
    counts: dict[str, int] = {}
    for _, status, _ in res:
        counts[status] = counts.get(status, 0) + 1
    bad = [(j, s, r) for j, s, r in res if s not in ("ok", "skipped")]
    parts = ", ".join(f"{n} {s}" for s, n in sorted(counts.items(), key=lambda kv: (kv[0] != "ok", kv[0])))
    if bad:
        t = Table(title=f"{len(bad)} of {len(jobs)} jobs did not finish ok (rerun the same command to retry them)")
        for col in ("job", "status", "error", "run folder"):
            t.add_column(col, overflow="fold")
        for j, s, r in bad:
            t.add_row(j.label, s, escape((r or {}).get("error") or "no record (killed, or the launcher failed)"),
                      (r or {}).get("output_dir", ""))
        wide(console, 160).print(t)
    style = "red" if bad else "green"
    console.print(f"[{style}]sweep done[/] in {seconds:.0f} s: {len(jobs)} jobs: {parts}", soft_wrap=True)
    return len(bad)
