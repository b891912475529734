"""`attnbench sweep`: a grid of runs through Hydra's multirun machinery, resumable, failure tolerant.

The grid is the experiment's ``hydra.sweeper.params`` plus sweeps on the command line
(``model=softmax,attention_bn seed=0,1``); the command line wins for the same key, as in Hydra.

Planning is Hydra's own: the multirun config is composed as ``Hydra.multirun`` does, the grid is
expanded by Hydra's ``BasicSweeper.split_arguments``, and each job's config is what
``load_sweep_config`` (the function every launcher composes its jobs with) gives it, composed once
per distinct combination of config choices, its value overrides applied as Hydra applies them
(``compose.JobComposer``: a grid of seeds costs a millisecond a job). That config is what is
checked (a mistake in any job's config, a missing dataset or an impossible (task, model) pair is
one line, exit 2), listed by ``--dry-run``, and keyed by ``job_keys.job_key``. What a job asks of
the machine it runs on (a GPU: trainer.device=cuda, trainer.precision=fp16; engine/env.py
``check_hardware``) is not checked by the plan, which may be made on a login node without one:
each job checks it where its launcher runs it, and a job that lacks it is recorded as failed with
that one line (the plan says so beforehand for the jobs this machine could not run).

Resume: a job whose result record (``results.path``) already holds an ``ok`` row with the same
``job_key`` (hash of the resolved config, seed included) is skipped by the plan; missing and
failed jobs are handed to the launcher of the config (the basic launcher, ``hydra/launcher=joblib``
(local processes), ``hydra/launcher=submitit_slurm``, the configs of ``conf/hydra/launcher/``).
``--force`` reruns everything. A launcher composes each job again where it runs it (possibly in
another process); the job checks that its config has the planned ``job_key`` before it runs, and
a mismatch is an error that names both keys.

Two sweeps of one records file at once: each job is claimed in the records file under its lock
before it runs (``claims.claim_job``); a job another live process has claimed, or that got an
``ok`` record since the plan, is skipped with one line (``skipped, running in pid N``), and the
claim of a process that is gone (kill -9) is taken over. A dry run lists every job, marking those
whose data is missing (of those to run: a finished job needs neither its data nor its model built);
a real sweep refuses them in one line.

Progress: jobs done / failed / running / to go with a time left, read from the records and
claims the jobs write whichever process runs them (``sweep_progress``; docs/progress.md).

Failures: a job that crashes, diverges (NaN loss) or runs out of memory is recorded by the runner
with its status and error and the sweep goes on. The exit status is the number of jobs of the grid
without an ``ok`` record after the sweep (capped at 125), not counting those another process is
still running; 0 when all are ok.

Search: with ``hydra/sweeper=optuna`` the grid's jobs are studies and their trials the jobs that
run (bench_cli/commands/study.py; docs/tuning.md), planned, claimed and recorded as above.
"""
from __future__ import annotations

import functools
import json
import os
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from bench_cli.config import compose as C
from bench_cli.config import plugins
from bench_cli.results import claims, csv_store, job_keys
from bench_cli.results.job_records import latest_ok_per_job
from bench_cli.config.args import parse
from bench_cli.core.errors import DataNotFoundError, UserError, catch_termination, exit_code_of, interruption_name
from bench_cli.core.files import write_atomically

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
JOB_NAME = "sweep"  # hydra.job.name of the jobs (their log is <job folder>/sweep.log), as @hydra.main named it
MAX_EXIT = 125


@dataclass
class Job:
    """A planned job: what the commands read of every job (key, label, records file, variant), not
    its config (20,000 configs would not fit), which is composed when read."""
    overrides: list[str]
    key: str
    base_label: str  # job_label of its config; ``label`` adds the swept values it does not show
    records_path: str = field(repr=False)  # results.path
    variant: tuple = field(repr=False)  # (task, dataset, model config): what validation checks once for all
    composer: C.JobComposer = field(repr=False)
    swept: frozenset = field(default=frozenset(), repr=False)  # the keys that vary between the sweep's jobs
    position: int | None = field(default=None, repr=False)  # its number in the sweep's lines; None: its place in the plan
    columns: dict = field(default_factory=dict, repr=False)  # record columns its config does not say (an Optuna trial's)

    @property
    def label(self) -> str:
        return " ".join([self.base_label, *label_extras(self.overrides, self.swept)])

    @functools.cached_property
    def cfg(self) -> DictConfig:
        """The job's config as the job gets it: composed as by Hydra, without its hydra node."""
        return self.composer.compose(self.overrides)

    def reading(self):
        """``with job.reading() as cfg``: the job's config, read-only, shared with the plan (no copy:
        the checks of a big grid)."""
        return self.composer.applied(self.overrides)


@dataclass
class Sweep:
    """The plan: the multirun config (with its hydra node: launcher, sweep folder) and its jobs."""
    master: DictConfig = field(repr=False)
    jobs: list[Job]
    flags: dict = field(default_factory=dict)  # Hydra's search-path flags (--config-dir ...)
    total: int | None = None  # how many jobs its lines count ([sweep i/total]); None: its jobs


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
    live_line: bool = False  # the sweep draws its progress on a live terminal line (sweep_progress)
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


LABEL_SHOWS = {"task", "task.name", "task.dataset", "model", "model.name", "seed"}  # job_label's own part


def job_label(cfg, overrides=(), swept=frozenset()) -> str:
    """'uea/JapaneseVowels softmax seed=0', then every swept override it does not show
    (model.attention.name=boomatt), so no two jobs of a sweep read alike."""
    ds = OmegaConf.select(cfg, "task.dataset", default=None)
    return " ".join([f"{cfg.task.name}/{ds or '-'} {cfg.model.name} seed={cfg.seed}", *label_extras(overrides, swept)])


def label_extras(overrides, swept: frozenset) -> list[str]:
    """The swept overrides a job's label does not show already."""
    return [o for o in overrides if _override_key(o) in swept and _override_key(o) not in LABEL_SHOWS
            and "/" not in _override_key(o)]  # experiment/zoo/_case=...: a choice of what the label shows


def _override_key(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


def swept_keys(override_lists) -> frozenset:
    """The keys whose value differs between the jobs' override lists (or that some jobs lack)."""
    lists = [list(ovs) for ovs in override_lists]
    values: dict[str, set] = {}
    for ovs in lists:
        for o in ovs:
            values.setdefault(_override_key(o), set()).add(o.split("=", 1)[-1])
    present = {k: sum(any(_override_key(o) == k for o in ovs) for ovs in lists) for k in values}
    return frozenset(k for k, vs in values.items() if len(vs) > 1 or present[k] < len(lists))


# --- the plan ---------------------------------------------------------------------------------
OPTUNA_SWEEPER = "hydra_plugins.hydra_optuna_sweeper.optuna_sweeper.OptunaSweeper"  # hydra/sweeper=optuna


def is_search(master: DictConfig) -> bool:
    """Whether the sweep is Optuna's (hydra/sweeper=optuna: bench_cli/commands/study.py runs it)."""
    return str(OmegaConf.select(master, "hydra.sweeper._target_", default="")) == OPTUNA_SWEEPER


def sweep_lines(master: DictConfig, config_loader=None) -> list:
    """The sweep's overrides parsed: the config's ``hydra.sweeper.params`` first, then the command
    line (which replaces a param of the same key), as Hydra's sweepers take them."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    sweeper = master.hydra.sweeper
    params = OmegaConf.to_container(sweeper.params, resolve=True) if sweeper.get("params") else {}
    # as typed: an override whose value has an interpolation is the job's to resolve, not the plan's
    lines = [f"{k}={v}" for k, v in params.items()] + OmegaConf.to_container(master.hydra.overrides.task)
    try:
        return OverridesParser.create(config_loader=config_loader).parse_overrides(lines)
    except HydraException as e:
        raise UserError(f"cannot expand the grid: {str(e).strip().splitlines()[0]}") from None


def searched(override) -> bool:
    """In an Optuna sweep, the overrides Optuna samples (interval(), choice(), range()); a comma
    list or a glob is a grid of studies, one per value, each searched alike (a variant per study:
    the comparison of attentions tunes each of them with the same number of trials)."""
    from hydra.core.override_parser.types import ValueType

    return override.value_type in (ValueType.CHOICE_SWEEP, ValueType.RANGE_SWEEP, ValueType.INTERVAL_SWEEP)


def split_search(parsed: list) -> tuple[list, dict]:
    """(the overrides of the grid, {key: override} of those Optuna samples) of an Optuna sweep's
    ``sweep_lines``; the last override of a key is the one taken, as by Hydra's sweepers."""
    last = {o.get_key_element(): o for o in parsed}
    return ([o for o in parsed if not searched(last[o.get_key_element()])],
            {k: o for k, o in last.items() if searched(o)})


def job_overrides(app: C.HydraApp, master: DictConfig) -> list[list[str]]:
    """Override lists of every job, as Hydra's BasicSweeper.sweep makes them (``sweep_lines``).
    An Optuna sweep's are its studies' (each without the overrides Optuna samples: ``searched``)."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.errors import HydraException

    target = str(master.hydra.sweeper.get("_target_", ""))
    if not target.endswith(".BasicSweeper") and not is_search(master):
        raise UserError(f"`attnbench sweep` runs Hydra's basic sweeper (a grid) and Optuna's (hydra/sweeper=optuna); "
                        f"{target} is not supported")
    parsed = sweep_lines(master, app.config_loader)
    if is_search(master):
        parsed, _ = split_search(parsed)
    C.refuse_search(parsed)
    try:
        (grid,) = BasicSweeper.split_arguments(parsed, None)
    except HydraException as e:
        raise UserError(f"cannot expand the grid: {str(e).strip().splitlines()[0]}") from None
    return grid


def plan_job(composer: C.JobComposer, overrides: list[str]) -> Job:
    """One job with its job_key, as its launcher composes it (``compose.JobComposer``)."""
    composer.check(overrides)
    with composer.applied(overrides) as cfg:
        try:
            key = job_keys.job_key(composer.resolved(cfg, overrides))
            label, records_path, variant = job_label(cfg), str(cfg.results.path), _checked_as(cfg)
        except Exception as e:  # noqa: BLE001 - an interpolation that does not resolve
            raise UserError(f"job '{' '.join(overrides)}': cannot resolve its config: "
                            f"{str(e).splitlines()[0]}") from None
    return Job(list(overrides), key, label, records_path, variant, composer)


@contextmanager
def _multirun(overrides: list[str], flags: dict | None):
    """(HydraApp, the multirun config) for the time of the ``with``, composed as Hydra's multirun
    composes it (``hydra.mode=MULTIRUN`` added as hydra/_internal/utils.py ``_run_app`` adds it)."""
    from hydra.types import RunMode

    C.check_group_choices(overrides, allow_sweep=True, allow_search=True)  # interval(): job_overrides judges
    given = {o.split("=", 1)[0] for o in overrides}
    mode = [] if "hydra.mode" in given else ["hydra.mode=MULTIRUN"]
    with C.hydra_app(JOB_NAME, flags) as app:
        try:
            master = app.compose([*overrides, *mode], RunMode.MULTIRUN)
        except UserError as e:
            raise _without_optuna(e) from None
        yield app, master


def _without_optuna(error: UserError) -> UserError:
    """Hydra's "Could not find 'hydra/sweeper/optuna'" where the plugin is not installed: how to get it."""
    import importlib.util

    from bench_cli.core.extras import install_hint

    if "hydra/sweeper/optuna" in str(error) and importlib.util.find_spec("hydra_plugins.hydra_optuna_sweeper") is None:
        return UserError(f"hydra/sweeper=optuna needs Hydra's Optuna sweeper, which is not installed: "
                         f"{install_hint('tune')}")
    return error


def expand_grid(overrides: list[str], flags: dict | None = None) -> list[list[str]]:
    """The override lists of every job of a sweep (nothing composed but the multirun config)."""
    with _multirun(overrides, flags) as (app, master):
        return job_overrides(app, master)


def plan_sweep(overrides: list[str], flags: dict | None = None, progress: bool = False) -> Sweep:
    """The multirun config and its distinct jobs (a grid can name the same config twice, e.g.
    seed=0,0). ``flags``: Hydra's --config-dir / --config-name / --config-path. ``progress``: a
    bar (a line every few seconds without a terminal) when planning takes more than a moment."""
    from bench_cli.core.progress import count_progress

    with _multirun(overrides, flags) as (app, master), C.shared_config_files(), C.shared_interpolation_parses():
        grid = job_overrides(app, master)
        composer = C.JobComposer(app, master)
        shown = {"every_s": 5, "after_s": 2 if progress else None}
        with count_progress("composing the sweep's configurations", len(grid), **shown) as update:
            composer.prepare(grid, progress=update)
        jobs = []
        with count_progress("planning the sweep", len(grid), **shown) as update:
            for ovs in grid:
                jobs.append(plan_job(composer, ovs))
                update(len(jobs), len(grid))
    seen, unique = set(), []
    for job in jobs:
        if job.key not in seen:
            seen.add(job.key)
            unique.append(job)
    if unique:  # outside Hydra's session: the check composes the group defaults with the compose API
        C.check_value_types(unique[0].cfg, unique[0].overrides)
    swept = swept_keys(j.overrides for j in unique)
    for job in unique:
        job.swept = swept
    return Sweep(master, unique, dict(flags or {}))


def plan(overrides: list[str]) -> list[Job]:
    """The distinct jobs of a sweep's overrides."""
    return plan_sweep(overrides).jobs


def _checked_as(cfg) -> tuple:
    """Jobs checked once for all: same task, dataset and model config (the seeds of one variant;
    not the model's name alone: model.attention.name=a,b are two models of one name)."""
    model = json.dumps(OmegaConf.to_container(cfg.model, resolve=True), sort_keys=True, default=str)
    return cfg.task.name, OmegaConf.select(cfg, "task.dataset", default=None), model


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
    with _multirun(overrides, flags) as (app, master):
        firsts = {data_id(ovs): ovs for ovs in reversed(job_overrides(app, master))}
        composer = C.JobComposer(app, master)
        for ovs in reversed(list(firsts.values())):
            checked = None
            try:
                cfg = plan_job(composer, ovs).cfg
                checked = _checked_as(cfg)[:2]
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


def done_keys(path) -> dict[str, dict]:
    """job_key -> latest ok record."""
    return latest_ok_per_job(csv_store.read_records(path))


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
    catch_termination()  # a worker process SIGTERMed (Slurm, joblib) records its job as interrupted
    plugins.import_plugins()  # the sweep's plugins in this process too (joblib worker, Slurm job): once each
    plugins.import_configured(cfg)
    hc = HydraConfig.get()
    overrides = tuple(hc.overrides.task)
    position = plan.check(overrides, cfg)
    head, key = _head(position, plan.total), plan.keys[overrides][1]
    label = job_label(cfg, overrides, plan.swept)
    say = _job_printer(plan)
    claimed = claim(cfg, key, plan, head, label, say)
    if claimed is False:
        return "skipped"
    threads = _threads_for_launcher(cfg)
    if threads:
        torch.set_num_threads(threads)
    try:
        columns = plan.columns.get(key)
        if not claimed:  # a job of several processes: not claimed
            return _run_job(cfg, hc, position, plan.total, head, label, say, columns)
        with claims.heartbeat(str(cfg.results.path), key):  # the claim stays fresh however long the job runs
            return _run_job(cfg, hc, position, plan.total, head, label, say, columns)
    except KeyboardInterrupt as e:  # recorded by the runner; in the sweep's own process it stops the sweep
        if os.getpid() == plan.sweep_pid:
            raise
        say(f"{head} [red]interrupted[/] ({interruption_name(e)}) {label}: the same sweep command resumes it "
            "from its checkpoint")
        return "interrupted"
    finally:
        if claimed:
            claims.release_job(str(cfg.results.path), key)


def _job_printer(plan: JobPlan):
    """``say(text)``: a job's line (rich markup) on the console; in another process than the
    sweep's, writing to the terminal where the sweep draws its live line, that line is cleared
    first (sweep_progress.clear_live_line)."""
    from bench_cli.commands.sweep_progress import clear_live_line
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


def _run_job(cfg: DictConfig, hc, position: int, total: int, head: str, label: str, say,
             columns: dict | None = None) -> str:
    """Train and record the job (``columns``: JobPlan.columns); print its line (``say``); its status."""
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


def _head(position: int, total: int) -> str:
    from rich.markup import escape

    return escape(f"[sweep {position + 1:>{len(str(total))}}/{total}]")


def launch(sweep: Sweep, todo: list[Job], ok_rows_from: dict | None = None, live_line: bool = False,
           first_job_idx: int = 0) -> list:
    """Run ``todo`` with the launcher of the sweep's config, in batches of
    ``hydra.sweeper.max_batch_size``, as Hydra's ``Hydra.multirun`` and ``BasicSweeper.sweep`` do
    (callbacks, ``multirun.yaml`` in the sweep folder), minus their second expansion and
    composition of the grid: the jobs are the plan's. Returns Hydra's JobReturns; stops after a
    batch in which a job did not match the plan. ``ok_rows_from``, ``live_line``: see ``JobPlan``;
    ``first_job_idx``: the first job's number in the sweep folder (the jobs launched before it)."""
    from hydra._internal.callbacks import Callbacks
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
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
    with C.hydra_app(JOB_NAME, sweep.flags) as app:
        setup_globals()
        callbacks = Callbacks(master)
        callbacks.on_multirun_start(config=master, config_name=app.config_name)
        launcher = Plugins.instance().instantiate_launcher(
            hydra_context=HydraContext(config_loader=app.config_loader, callbacks=callbacks),
            task_function=task_function, config=master)
        sweep_dir = Path(str(master.hydra.sweep.dir))
        sweep_dir.mkdir(parents=True, exist_ok=True)
        write_atomically(sweep_dir / "multirun.yaml", OmegaConf.to_yaml(master))
        batches = BasicSweeper.split_overrides_to_chunks([j.overrides for j in todo], master.hydra.sweeper.get("max_batch_size"))
        for batch in batches:
            returns += launcher.launch(batch, initial_job_idx=first_job_idx + len(returns))
            if any(isinstance(_error_of(r), PlanMismatchError) for r in returns):
                break
        callbacks.on_multirun_end(config=master, config_name=app.config_name)
    return returns


def _error_of(job_return) -> BaseException | None:
    from hydra.core.utils import JobStatus

    return job_return._return_value if job_return.status == JobStatus.FAILED else None  # no public accessor


# --- the command ------------------------------------------------------------------------------
@hydra.main(version_base=C.HYDRA_VERSION_BASE, config_path="pkg://conf", config_name=C.CONFIG_NAME)
def _hydra_sweep_flags(cfg: DictConfig) -> None:
    """Only for Hydra's own flags (--cfg, --info, --hydra-help): nothing is run through it."""
    raise SystemExit("attnbench sweep: internal error: the Hydra entry point only serves Hydra's flags")


def parse_sweep_args(args: list[str]):
    """(parsed arguments, Hydra's search-path flags); Hydra's flags that print are handed to Hydra
    (None is returned then)."""
    p = parse("sweep", args, SWEEP_OPTIONS, hydra=True, positional=False)
    flags = {k: v for k, v in p.hydra.items() if k not in ("-m", "--multirun")}  # a sweep is a multirun
    if HYDRA_SHOW_FLAGS & set(flags):
        C.dispatch_to_hydra(_hydra_sweep_flags, [a for a in p.hydra_args if a not in ("-m", "--multirun")]
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
    with C.shared_interpolation_parses():  # the plan's, and the checks' resolutions of job configs
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
    from bench_cli.core.ui import console

    jobs = sweep.jobs
    paths = {j.records_path for j in jobs}
    done = {}
    for path in paths:
        done.update(done_keys(path))
    n_done = sum(j.key in done for j in jobs)
    todo = jobs if force else [j for j in jobs if j.key not in done]
    # the jobs that will run (a done job needs neither its data nor its model built: a resumed
    # sweep starts at once); a dry run lists every job, data or not
    with C.shared_interpolation_parses():
        missing = validate_jobs(todo, missing_data_ok=dry_run)
    what = OmegaConf.select(jobs[0].cfg, "experiment_name", default=None) or "sweep"
    console.print(f"[bold]{what}[/]: {len(jobs)} jobs, {n_done} already done"
                  + (" (rerun: --force)" if force and n_done else "")
                  + f", {len(todo)} to run; records: {', '.join(sorted(paths))}", soft_wrap=True)
    _print_lacking(lacking_here(todo), len(todo))
    if dry_run:
        claimed = {}
        for path in paths:
            claimed.update(claims.claimed_jobs(path, [j.key for j in jobs], claims.claim_ttl(jobs[0].cfg)))
        _print_plan(jobs, done, force, missing, claimed)
        return
    if not todo:
        console.print("[green]nothing to do[/]: every job has an ok record (use --force to rerun)")
        return
    for i, job in enumerate(jobs):
        if not force and job.key in done:
            console.print(f"{_head(i, len(jobs))} [dim]skip[/]    {job.label}  (ok record {done[job.key].get('run_id', '')})",
                          highlight=False, soft_wrap=True)
    check_launcher_reachable(sweep.master)
    n_failed = run_sweep(sweep, todo, paths, done if not force else {}, force=force)
    if n_failed:
        raise SystemExit(min(n_failed, MAX_EXIT))


def check_launcher_reachable(master: DictConfig) -> None:
    """A Slurm launcher (hydra/launcher=slurm, slurm_ddp, submitit_slurm) where no Slurm is
    reachable (no ``sbatch`` on the PATH) is one line, before submitit's traceback."""
    import shutil

    target = str(OmegaConf.select(master, "hydra.launcher._target_", default="") or "")
    if target.endswith(".SlurmLauncher") and shutil.which("sbatch") is None:
        raise UserError("hydra/launcher=slurm: no Slurm is reachable from here (no sbatch on the PATH); run the sweep "
                        "on the cluster's login node, or here with hydra/launcher=local (a subprocess per job) or "
                        "hydra/launcher=joblib_cpu (jobs side by side)")


def start_launching() -> None:
    """Before a sweep launches its first job: the sweep's folder (hydra.sweep.dir) is named by a new
    run id, and the workers it starts import the same plugins."""
    from bench_cli.results.run_folder import new_run_id

    os.environ["ATTNBENCH_RUN_ID"] = new_run_id()
    plugins.export_to_environment()


def run_sweep(sweep: Sweep, todo: list[Job], paths: set[str], done_before: dict, force: bool = False) -> int:
    """Launch ``todo``, then summarise; the number of jobs without an ok record (those another
    process runs at the end are not counted)."""
    from rich.markup import escape

    from bench_cli.commands.sweep_progress import SweepProgress
    from bench_cli.core.ui import console

    before = {p: len(csv_store.read_records(p)) for p in paths}
    started = time.perf_counter()
    start_launching()
    try:
        with SweepProgress([(j.key, j.records_path) for j in todo], before, claims.claim_ttl(todo[0].cfg)) as progress:
            returns = launch(sweep, todo, before if force else None, live_line=progress.live)
    except KeyboardInterrupt as e:
        summarize(sweep.jobs, paths, before, done_before, time.perf_counter() - started)
        console.print(f"[red]interrupted[/] ({interruption_name(e)}): rerun the same command to run only the "
                      "missing and failed jobs")
        raise SystemExit(exit_code_of(e)) from None
    errors = [e for e in map(_error_of, returns) if e is not None]
    for e in errors:  # a job that failed outside its run (the run records its own failures)
        console.print(f"[bold red]error:[/] {escape(type(e).__name__)}: {escape(str(e))}", highlight=False,
                      soft_wrap=True)
    n_failed = summarize(sweep.jobs, paths, before, done_before, time.perf_counter() - started)
    return max(n_failed, 1) if errors else n_failed


def _print_plan(jobs: list[Job], done: dict, force: bool, missing: dict[str, str], claimed: dict[str, str]) -> None:
    """The dry run's table: every job, whether it is done or claimed by another process (``claimed``:
    job_key -> running where, or a stale claim), and whether its data is here (``missing``: job_key
    -> what is missing); then each missing dataset once, with how to get it."""
    from rich.markup import escape
    from rich.table import Table

    from bench_cli.core.ui import console, wide

    t = Table(title="jobs")
    for col in ("#", "job", "job_key", "status"):
        t.add_column(col)
    for i, j in enumerate(jobs, 1):
        status = ("[yellow]rerun[/]" if force else "[dim]done, skip[/]") if j.key in done else "to run"
        if j.key in claimed and (force or j.key not in done):
            status = escape(claimed[j.key])
        if j.key in missing:
            status += ", [red]data missing[/]"
        t.add_row(str(i), j.label, j.key, status)
    wide(console, 120).print(t)
    if missing:
        console.print(f"[red]data missing[/] for {len(missing)} of {len(jobs)} jobs (a sweep refuses to start "
                      "until it is here):", highlight=False)
        for message in dict.fromkeys(missing.values()):
            console.print(f"  {escape(message)}", highlight=False, soft_wrap=True)


def _print_lacking(lacking: dict[str, str], n_todo: int) -> None:
    """A note on the jobs to run that ask for what this machine lacks (a GPU): fine where the
    launcher puts them on a machine that has it (a Slurm GPU node); here they would be recorded as failed."""
    from rich.markup import escape

    from bench_cli.core.ui import console

    if lacking:
        console.print(f"[yellow]note[/]: {len(lacking)} of {n_todo} jobs to run ask for what this machine lacks; each "
                      "job checks the machine it runs on, one that lacks it is recorded as failed: "
                      f"{escape(next(iter(lacking.values())))}", highlight=False, soft_wrap=True)


def _print_checkpoints(rows: list[dict]) -> None:
    """Where the checkpoints of the jobs that did not finish are and how big (the same command
    resumes them; bench_cli/engine/checkpoint.py)."""
    from bench_cli.engine.checkpoint import folder_bytes
    from bench_cli.core.ui import console, human

    folders = {Path(r["checkpoint_dir"]) for r in rows if r.get("checkpoint_dir")}
    folders = sorted(f for f in folders if folder_bytes(f))
    if folders:
        roots = ", ".join(sorted({str(f.parent) for f in folders}))
        console.print(f"checkpoints of {len(folders)} unfinished jobs: {human(sum(map(folder_bytes, folders)), 'B')} "
                      f"in {roots} (the same command resumes them)", highlight=False, soft_wrap=True)


RUNNING_ELSEWHERE = "running elsewhere"  # an outcome: another process holds the job's claim


def outcomes(jobs: list[Job], paths, before: dict[str, int], done_before: dict) -> list[tuple[Job, str, dict | None]]:
    """(job, status, record) for every job: the status of its newest record written since the sweep
    started, 'skipped' when it has an ok record from before (or from another process that ran it),
    'running elsewhere' when another live process holds its claim, 'missing' when nothing was recorded."""
    new: dict[str, dict] = {}
    ok: dict[str, dict] = dict(done_before)
    running: dict[str, str] = {}
    for p in paths:
        rows = csv_store.read_records(p)
        for r in rows[before.get(p, 0):]:
            new[r.get("job_key", "")] = r
        ok.update(latest_ok_per_job(rows))
        running.update(claims.running_elsewhere(p, [j.key for j in jobs], claims.claim_ttl(jobs[0].cfg)))
    out = []
    for j in jobs:
        if j.key in new:
            out.append((j, new[j.key].get("status") or "failed", new[j.key]))
        elif j.key in ok:
            out.append((j, "skipped", ok[j.key]))
        elif j.key in running:
            out.append((j, RUNNING_ELSEWHERE, {"error": running[j.key]}))
        else:
            out.append((j, "missing", None))
    return out


def summarize(jobs, paths, before, done_before, seconds: float) -> int:
    from rich.markup import escape
    from rich.table import Table

    from bench_cli.core.ui import console, wide

    res = outcomes(jobs, paths, before, done_before)
    counts: dict[str, int] = {}
    for _, status, _ in res:
        counts[status] = counts.get(status, 0) + 1
    bad = [(j, s, r) for j, s, r in res if s not in ("ok", "skipped", RUNNING_ELSEWHERE)]
    parts = ", ".join(f"{n} {s}" for s, n in sorted(counts.items(), key=lambda kv: (kv[0] != "ok", kv[0])))
    if bad:
        t = Table(title=f"{len(bad)} of {len(jobs)} jobs did not finish ok (rerun the same command to retry them)")
        for col in ("job", "status", "error", "run folder"):
            t.add_column(col, overflow="fold")
        for j, s, r in bad:
            t.add_row(j.label, s, escape((r or {}).get("error") or "no record (killed, or the launcher failed)"),
                      (r or {}).get("output_dir", ""))
        wide(console, 160).print(t)
        _print_checkpoints([r for _, _, r in bad if r])
    style = "red" if bad else "green"
    console.print(f"[{style}]sweep done[/] in {seconds:.0f} s: {len(jobs)} jobs: {parts}", soft_wrap=True)
    _print_offline_runs([r["output_dir"] for _, s, r in res if s != "skipped" and (r or {}).get("output_dir")])
    return len(bad)


def _print_offline_runs(output_dirs: list[str]) -> None:
    """The command that uploads the jobs' offline wandb runs (logger=wandb offline; docs/logging.md)."""
    from bench_cli.results.loggers import offline_sync
    from bench_cli.core.ui import print_path

    found = offline_sync(output_dirs)
    if found:
        print_path(f"wandb offline runs ({found[0]}), upload them with", found[1])
