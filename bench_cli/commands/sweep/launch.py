"""Launcher plumbing: the planned jobs handed to the launcher of the sweep's config (the basic
launcher, ``hydra/launcher=joblib`` (local processes), ``hydra/launcher=submitit_slurm``, the
configs of ``conf/hydra/launcher/``), in batches, as Hydra's multirun does, with the plan each job
checks itself against (``job.JobPlan``); what a launched job returned.
"""
from __future__ import annotations

import functools
import os
from pathlib import Path

from omegaconf import OmegaConf

from bench_cli.commands.sweep.job import JobPlan, PlanMismatchError, run_planned_job
from bench_cli.commands.sweep.plan import JOB_NAME, Job, Sweep
from bench_cli.config import compose, hydra_private, plugins
from bench_cli.core.files import write_atomically


def start_launching() -> None:
    """Before a sweep launches its first job: the sweep's folder (hydra.sweep.dir) is named by a new
    run id, and the workers it starts import the same plugins."""
    from bench_cli.results.run_folder import new_run_id

    os.environ["ATTNBENCH_RUN_ID"] = new_run_id()
    plugins.export_to_environment()


def launch(sweep: Sweep, todo: list[Job], ok_rows_from: dict | None = None, live_line: bool = False,
           first_job_idx: int = 0) -> list:
    """Run ``todo`` with the launcher of the sweep's config, in batches of
    ``hydra.sweeper.max_batch_size``, as Hydra's ``Hydra.multirun`` and ``BasicSweeper.sweep`` do
    (callbacks, ``multirun.yaml`` in the sweep folder), minus their second expansion and
    composition of the grid: the jobs are the plan's. Returns Hydra's JobReturns; stops after a
    batch in which a job did not match the plan. ``ok_rows_from``, ``live_line``: see ``JobPlan``;
    ``first_job_idx``: the first job's number in the sweep folder (the jobs launched before it)."""
    from hydra.core.plugins import Plugins
    from hydra.core.utils import setup_globals
    from hydra.types import HydraContext

    master = sweep.master
    keys = {tuple(j.overrides): (i if j.position is None else j.position, j.key) for i, j in enumerate(sweep.jobs)}
    swept = sweep.jobs[0].swept if sweep.jobs else frozenset()
    columns = {j.key: j.columns for j in sweep.jobs if j.columns}
    task_function = functools.partial(run_planned_job, plan=JobPlan(keys, sweep.total or len(sweep.jobs), os.getpid(),
                                                                    dict(ok_rows_from or {}), swept, live_line, columns))
    returns: list = []
    with compose.hydra_app(JOB_NAME, sweep.flags) as app:
        setup_globals()
        callbacks = hydra_private.callbacks(master)
        callbacks.on_multirun_start(config=master, config_name=app.config_name)
        launcher = Plugins.instance().instantiate_launcher(
            hydra_context=HydraContext(config_loader=app.config_loader, callbacks=callbacks),
            task_function=task_function, config=master)
        sweep_dir = Path(str(master.hydra.sweep.dir))
        sweep_dir.mkdir(parents=True, exist_ok=True)
        write_atomically(sweep_dir / "multirun.yaml", OmegaConf.to_yaml(master))
        batches = hydra_private.sweep_batches([j.overrides for j in todo], master.hydra.sweeper.get("max_batch_size"))
        for batch in batches:
            returns += launcher.launch(batch, initial_job_idx=first_job_idx + len(returns))
            if any(isinstance(error_of(r), PlanMismatchError) for r in returns):
                break
        callbacks.on_multirun_end(config=master, config_name=app.config_name)
    return returns


def error_of(job_return) -> BaseException | None:
    """The exception a launched job raised outside its run (the run records its own failures), or None."""
    return hydra_private.job_error(job_return)
