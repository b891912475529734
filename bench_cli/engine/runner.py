"""One run as a straight line (``run_experiment``): the environment -> the task -> the model ->
training (the Trainer trains and selects) -> measurement -> the record.

Every run appends exactly one record, whatever happens: ``ok``, ``nan`` (diverged), ``oom``,
or ``failed`` (with the error). User mistakes found inside a run are re-raised as UserError
after recording, so the CLI prints one line and exits 2.
"""
from __future__ import annotations

import gc
import json
import time
import traceback
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from omegaconf import DictConfig

from bench_cli.config import plugins
from bench_cli.config.taskfit import build_task
from bench_cli.core.errors import UserError
from bench_cli.core.files import write_atomically
from bench_cli.core.phases import PHASES, process_age_s
from bench_cli.engine.checkpoint import Checkpoints
from bench_cli.engine.env import Environment, prepare_environment, unprepared_environment
from bench_cli.engine.measure import measure_run
from bench_cli.engine.timing import Conditions
from bench_cli.engine.objective import Objective
from bench_cli.engine.pruning import trial_pruning
from bench_cli.engine.trainer import Trainer
from bench_cli.results import samples, schema
from bench_cli.results.run_folder import RunFolder, start_run, write_record
from bench_cli.results.loggers import LineLogger, Loggers, run_loggers


@dataclass
class RunOutcome:
    """How a run ended, for the command that started it: the record written (bench_cli.results.schema
    names its columns) and what is not part of it."""

    record: dict
    error: BaseException | None = None  # what ended a run whose status is not ok (its one line is in the record)
    rank: int = 0  # this process's rank in a distributed run: rank 0 reports
    logged: list[tuple[str, str]] = field(default_factory=list)  # (what, where): history.csv, wandb's folder...
    append_error: str | None = None  # the record could not be appended to results.path: why, and where it is


def run_experiment(cfg: DictConfig, run_dir: Path | None = None, progress=None, overrides=None,
                   run_id: str | None = None, line_prefix: str = "", columns: dict | None = None,
                   resolved: dict | None = None) -> RunOutcome:
    """Train and evaluate one configuration (checked beforehand: bench_cli.commands.validate); append its
    record and return it with how the run ended.

    The run folder gets ``config.yaml`` and ``run.json`` (who runs it, since when) at the start and
    ``record.json`` at the end, whatever happens; a folder without ``record.json`` is a run that
    was killed (``attnbench ls runs``). The record is written to the run folder first, then
    appended to ``results.path``; if that append fails (full disk, read-only filesystem) the run
    folder still holds it and the message says where. ``columns``: what the caller knows of the
    run that its config does not say (an Optuna trial's study and number: schema.STUDY_COLUMNS);
    ``resolved``: ``cfg`` resolved, when the caller has resolved it already (resolved once)."""
    started = time.perf_counter()
    PHASES.forget(*RUN_STAGES)
    columns, pruning = trial_pruning(columns)  # an Optuna trial's pruner: not a record column
    # trainer.strategy=ddp: every process trains its shard; rank 0 alone measures, logs and records.
    try:
        env = prepare_environment(cfg)
    except UserError as e:  # this machine lacks what the job asks (env.check_hardware): a failed record
        record_refusal(cfg, e, run_dir, run_id, overrides, columns, started)
        raise
    run = start_run(cfg, run_dir, run_id, overrides, write=env.is_main, columns=columns, resolved=resolved)
    row = run.row
    row["device"], row["precision"] = env.description, env.precision
    checkpoints = run_checkpoints(cfg, run, started, env)
    conditions = Conditions.now()  # the load before and after: a record says what its times were taken under
    logger = error = None
    try:
        task = set_up_task(cfg, row["protocol"])
        model = build_model(cfg, task, env)
        logger = run_logger(cfg, env, run, task, line_prefix, checkpoints)
        objective = Objective.of(task, cfg.model)
        trainer = Trainer(cfg.trainer, task, model, env.device, env.seed, objective=objective, logger=logger,
                          progress=progress if env.is_main else None, dist=env.dist, checkpoints=checkpoints,
                          keep_samples=samples.enabled(cfg), on_evaluation=pruning)
        with setup_frozen(), PHASES("fit"):
            result = trainer.fit(row["protocol"])
        row.update(result.metrics)
        row.update(samples.save(run.path, result.samples))  # per-sample test outputs: paired comparisons
        if env.is_main:
            with PHASES("measure"):
                row.update(measure_run(task, model, cfg, env.device, objective))
        row.update(schema.timing_columns(conditions.done(), row))
        row.update(metrics_json={"data": task.describe(), "history": result.history}, status="ok")
    except (Exception, KeyboardInterrupt, SystemExit) as e:  # noqa: BLE001 - every ending is recorded, then re-raised
        error = e
    finally:
        outcome = finish(cfg, row, error, env, run.path, started, logger, checkpoints)
    if isinstance(error, (UserError, KeyboardInterrupt, SystemExit)):
        raise error
    return outcome


def record_refusal(cfg: DictConfig, error: UserError, run_dir: Path | None, run_id: str | None, overrides,
                   columns: dict | None, started: float) -> None:
    """The record of a run refused before it started by the machine it runs on: no CUDA where
    trainer.device=cuda or fp16 asks for it, trainer.strategy=ddp not launched as several processes
    (`run` refuses those before it gets here). Status failed with the one line, written by the
    launch's rank 0, so that a sweep planned on another machine (a login node without GPUs) keeps
    its answer and goes on."""
    env = unprepared_environment(cfg)
    run = start_run(cfg, run_dir, run_id, overrides, write=env.is_main, columns=columns)
    finish(cfg, run.row, error, env, run.path, started, logger=None)


def set_up_task(cfg: DictConfig, protocol: str):
    """The task of ``cfg`` with its data read and split for ``protocol`` (under the environment's seeds)."""
    with PHASES("data"):
        task = build_task(cfg)
        task.setup(protocol)
    return task


def build_model(cfg: DictConfig, task, env: Environment):
    """The task's model of ``cfg.model`` on the run's device. Seeded again first: its initial
    weights do not depend on how much randomness reading the data drew."""
    with PHASES("model"):
        env.seed_everything()
        model = task.build_model(cfg.model).to(env.device)
    env.seed_process()  # same initial weights everywhere; each process its own dropout
    return model


def run_logger(cfg: DictConfig, env: Environment, run: RunFolder, task, line_prefix: str,
               checkpoints: Checkpoints | None) -> Loggers | None:
    """Rank 0's loggers: the tracker of ``cfg.logger``, the console's evaluation lines and the
    history CSV; a resumable fit's tracker continues the run its checkpoints name."""
    if not env.is_main:
        return None
    resumable = checkpoints is not None and checkpoints.settings.resume != "false"
    lines = LineLogger(task.selection_metric(), schema.protocol(run.row["protocol"]).selects, prefix=line_prefix)
    return run_loggers(cfg.logger, run.resolved, run.path, run.row, lines,
                       resume_folder=checkpoints.folder if resumable else None)


RUN_STAGES = ("data", "model", "fit", "resume", "checkpoint", "measure", "record")  # the stages of one run (PHASES)


def write_phases(run_dir: Path, **extra) -> None:
    """``phases.json``: this process's stages in seconds and its age (exec to now), for
    `attnbench bench-overhead`'s split of the time outside training; best effort (a diagnostic)."""
    try:
        payload = {**PHASES.as_dict(), **extra, "process_age_s": process_age_s()}
        write_atomically(run_dir / "phases.json", json.dumps(payload))
    except OSError:
        pass


def run_checkpoints(cfg: DictConfig, run, started: float, env: Environment) -> Checkpoints | None:
    """The run's checkpoints, each carrying the code's versions, the resolved config and the plugins
    by name (`attnbench evaluate` asks the user for them: a file never names modules to import)."""
    meta = {k: str(run.row[k]) for k in ("git_commit", "attnbench_version", "torch_version")}
    meta.update(config=run.resolved, plugins=[p.module for p in plugins.loaded()])
    return Checkpoints.of(cfg, run.row["job_key"], meta, started, env.dist)


# Whether a caller of this process froze objects of its own (seen at a run's start): once seen, taken as
# kept for the process's later runs, because the check, gc.get_freeze_count(), walks the list of frozen
# objects (CPython 3.11 Modules/gcmodule.c, gc_list_size): 50-80 ms for the 200,000 a test worker froze.
_caller_froze = False


@contextmanager
def setup_frozen():
    """While training, the setup's objects (configs, modules, datasets: far more than a bare loop
    holds) are out of the cyclic collector's sight, so its collections during training do not walk
    them again (gc.freeze); unfrozen after, so a sweep worker's next job can collect them.

    A process that has frozen objects of its own before the run (a test worker freezes torch, Hydra
    and its test modules once collected; a program that embeds the run) keeps them frozen: the run
    then neither collects nor freezes, because gc.unfreeze() cannot tell its objects from the
    caller's and would hand all of them back to every later full collection (in the test suite, a
    second of CPU for each of the hundreds of runs made in one worker)."""
    global _caller_froze
    if _caller_froze or gc.get_freeze_count():
        _caller_froze = True
        yield
        return
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def finish(cfg: DictConfig, row: dict, error: BaseException | None, env: Environment, run_dir: Path, started: float,
           logger, checkpoints: Checkpoints | None = None) -> RunOutcome:
    """How the run ended (status, error, error.txt), its wall time (every sitting's), then the
    record: to the run folder first, then appended to ``results.path``; an ok job's checkpoints
    removed (unless kept); the loggers' summary; the processes shut down."""
    outcome = RunOutcome(row, error, env.dist.rank)
    row.update(schema.ending(error))
    if error is not None and not isinstance(error, (UserError, KeyboardInterrupt, SystemExit)):
        name = "error.txt" if env.is_main else f"error_rank{env.dist.rank}.txt"
        write_atomically(run_dir / name, "".join(traceback.format_exception(error)))
    earlier = checkpoints.earlier_wall_s if checkpoints is not None else 0.0
    row["wall_time_s"] = round(earlier + time.perf_counter() - started, 3)
    if checkpoints is not None:
        row.update(checkpoints.columns())
    else:
        row.update(sittings=1)
    if env.is_main:
        with PHASES("record"):
            outcome.append_error = write_record(run_dir, cfg.results.path, row)
        write_phases(run_dir, train_time_s=row.get("train_time_s"))
    if checkpoints is not None and env.is_main:
        checkpoints.finish(row["status"])
    if logger is not None:
        logger.log_summary({k: v for k, v in row.items() if k != "metrics_json"})
        logger.finish(row["status"])
        outcome.logged = logger.locations()  # the summary says where (history.csv, wandb's folder and sync command)
    env.shutdown()
    return outcome
