"""What a sweep checks before it launches anything: every job's config (settings, the model fits
the task and builds, once per distinct variant), its data (one line for the whole grid, checked on
one job per dataset before the grid is composed), the (task, model) pairs a grid may leave out, what
this machine lacks of what the jobs ask (a GPU: noted, not refused, since each job checks the
machine where its launcher runs it), and whether the launcher can be reached.

A mistake in any job's config, a missing dataset or an impossible (task, model) pair is one line,
exit 2. What a job asks of the machine it runs on (trainer.device=cuda, trainer.precision=fp16;
engine/env.py ``check_hardware``) is not refused here: the plan may be made on a login node without
a GPU, and a job that lacks it is recorded as failed with that one line.
"""
from __future__ import annotations

import json

from omegaconf import DictConfig, OmegaConf

from bench_cli.commands.sweep import plan
from bench_cli.commands.sweep.plan import Job
from bench_cli.config import compose
from bench_cli.core.errors import DataNotFoundError, UserError


def validate_jobs(jobs: list[Job], *, missing_data_ok: bool = False) -> dict[str, str]:
    """bench_cli.commands.validate on every job: settings, data present, model fits the task (once per
    distinct (task, dataset, model)), model builds (once per distinct task and model config).
    Missing data is one line for the whole grid, or with ``missing_data_ok`` (a dry run) the
    answer: job_key -> what is missing, for the jobs whose data is not here."""
    from bench_cli.commands.validate import check_config, check_model_builds

    seen_model: set[str] = set()
    missing_of: dict[tuple, str | None] = {}  # (task, dataset, model) -> the missing-data message
    for job in jobs:
        data_id = job.variant
        if data_id in missing_of:
            continue
        try:
            with job.reading() as cfg:
                task = check_config(cfg, hardware=False)  # each job checks its machine where it runs
                missing_of[data_id] = None
                model_id = json.dumps([OmegaConf.to_container(cfg.task, resolve=True),
                                       OmegaConf.to_container(cfg.model, resolve=True)], sort_keys=True, default=str)
                if model_id not in seen_model:
                    seen_model.add(model_id)
                    check_model_builds(task, cfg, recorded=True)  # a model that fails when it runs: a failed row
        except DataNotFoundError as e:
            missing_of[data_id] = str(e)
        except UserError as e:
            raise UserError(f"job '{' '.join(job.overrides)}': {e}") from None
    missing = {j.key: m for j in jobs if (m := missing_of[j.variant])}
    if missing and not missing_data_ok:
        raise missing_data_error(missing_of)
    return missing


def lacking_here(jobs: list[Job]) -> dict[str, str]:
    """job_key -> what this machine lacks of what the job asks (engine/env.check_hardware), for the
    jobs it could not run; judged once per distinct device, precision and strategy."""
    from bench_cli.engine.env import check_hardware

    asks: dict[tuple, str | None] = {}
    lacking = {}
    for job in jobs:
        with job.reading() as cfg:
            t = cfg.trainer
            wish = (str(t.device), str(t.get("precision", "32")), str(t.get("strategy", "none")))
            if wish not in asks:
                try:
                    check_hardware(cfg)
                    asks[wish] = None
                except UserError as e:
                    asks[wish] = str(e)
        if asks[wish]:
            lacking[job.key] = asks[wish]
    return lacking


def missing_data_error(missing_of: dict[tuple, str | None]) -> UserError:
    """One line for the grid's missing data: the first dataset's message, how many more, and the
    datasets that are here. ``missing_of``: (task, dataset, ...) -> the missing-data message or None."""
    uniq = list(dict.fromkeys(m for m in missing_of.values() if m))
    more = f" (and {len(uniq) - 1} more datasets)" if len(uniq) > 1 else ""
    here = sorted({str(d[1]) for d, m in missing_of.items() if m is None and d[1] is not None})
    hint = f"; or restrict the dataset axis to what is here: task.dataset={','.join(here)}" if here else ""
    return UserError(f"{uniq[0]}{more}{hint}")


# Override keys that can decide which data a job reads; the others (model, seed, trainer...) cannot.
DATA_KEYS = ("task", "experiment", "paths", "data")


def check_data_first(overrides: list[str], flags: dict | None = None) -> None:
    """Refuse a grid whose data is missing before composing every job (a big grid takes half a
    minute to plan): one job per distinct value of the keys that decide the data (DATA_KEYS) is
    composed and its task's data checked. The full check (validate_jobs) still follows."""
    from bench_cli.config.taskfit import build_task

    def data_id(ovs: list[str]) -> tuple:
        return tuple(o for o in ovs if o.lstrip("+~").split("=", 1)[0].split(".")[0].split("/")[0] in DATA_KEYS)

    missing_of: dict[tuple, str | None] = {}
    with plan.multirun_config(overrides, flags) as (app, master):
        firsts = {data_id(ovs): ovs for ovs in reversed(plan.job_overrides(app, master))}
        composer = compose.JobComposer(app, master)
        for ovs in reversed(list(firsts.values())):
            checked = None
            try:
                cfg = plan.plan_job(composer, ovs).cfg
                checked = plan.variant_of(cfg)[:2]
                if checked not in missing_of:
                    missing_of[checked] = None
                    build_task(cfg).check_data()
            except DataNotFoundError as e:
                missing_of[checked] = str(e)
            except Exception:  # noqa: BLE001 - anything else is the full check's to report, job by job
                missing_of.pop(checked, None)
    if any(missing_of.values()):
        raise missing_data_error(missing_of)


def skip_incapable(jobs: list[Job]) -> tuple[list[Job], list[tuple[Job, str]]]:
    """(jobs kept, (job, reason) left out): with ``sweep.skip_incapable`` in its config (a grid that
    crosses tasks with every model: experiment zoo/offline), a job whose (task, model) pair the
    registry's capabilities refuse (config.taskfit.check_model_fits_task) is left out with the refusal as
    its reason, instead of refusing the whole grid; other jobs are kept as they are. Judged once
    per (task, dataset, model), on its first job's config."""
    from bench_cli.config.taskfit import build_task, check_model_fits_task

    kept, skipped, reasons = [], [], {}
    for job in jobs:
        if job.variant not in reasons:
            reasons[job.variant] = None
            with job.reading() as cfg:
                if OmegaConf.select(cfg, "sweep.skip_incapable", default=False):
                    try:
                        check_model_fits_task(build_task(cfg), cfg)
                    except UserError as e:
                        reasons[job.variant] = str(e)
        if reasons[job.variant]:
            skipped.append((job, reasons[job.variant]))
        else:
            kept.append(job)
    return kept, skipped


def check_launcher_reachable(master: DictConfig) -> None:
    """A Slurm launcher (hydra/launcher=slurm, slurm_ddp, submitit_slurm) where no Slurm is
    reachable (no ``sbatch`` on the PATH) is one line, before submitit's traceback."""
    import shutil

    target = str(OmegaConf.select(master, "hydra.launcher._target_", default="") or "")
    if target.endswith(".SlurmLauncher") and shutil.which("sbatch") is None:
        raise UserError("hydra/launcher=slurm: no Slurm is reachable from here (no sbatch on the PATH); run the sweep "
                        "on the cluster's login node, or here with hydra/launcher=local (a subprocess per job) or "
                        "hydra/launcher=joblib_cpu (jobs side by side)")

