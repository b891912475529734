"""A sweep's plan: its jobs, each with its config (composed as its launcher will compose it), its
``job_key`` and its label, read from the grid of the experiment and of the command line.

Planning is Hydra's own: the multirun config is composed as ``Hydra.multirun`` does, the grid is
expanded by Hydra's ``BasicSweeper.split_arguments``, and each job's config is what
``load_sweep_config`` (the function every launcher composes its jobs with) gives it, composed once
per distinct combination of config choices, its value overrides applied as Hydra applies them
(``compose.JobComposer``: a grid of seeds costs a millisecond a job). That config is what the
checks read (bench_cli/commands/sweep/checks.py), what ``--dry-run`` lists, and what
``job_keys.job_key`` keys.
"""
from __future__ import annotations

import functools
import json
from contextlib import contextmanager
from dataclasses import dataclass, field

from omegaconf import DictConfig, OmegaConf

from bench_cli.config import compose, hydra_private
from bench_cli.core.errors import UserError
from bench_cli.results import csv_store, job_keys
from bench_cli.results.job_records import latest_ok_per_job

JOB_NAME = "sweep"  # hydra.job.name of the jobs (their log is <job folder>/sweep.log), as @hydra.main named it


@dataclass
class Job:
    """A planned job: what the commands read of every job (key, label, records file, variant), not
    its config (20,000 configs would not fit), which is composed when read."""
    overrides: list[str]
    key: str
    base_label: str  # job_label of its config; ``label`` adds the swept values it does not show
    records_path: str = field(repr=False)  # results.path
    variant: tuple = field(repr=False)  # (task, dataset, model config): what validation checks once for all
    composer: compose.JobComposer = field(repr=False)
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


def job_overrides(app: compose.HydraApp, master: DictConfig) -> list[list[str]]:
    """Override lists of every job, as Hydra's BasicSweeper.sweep makes them (``sweep_lines``).
    An Optuna sweep's are its studies' (each without the overrides Optuna samples: ``searched``)."""
    from hydra.errors import HydraException

    target = str(master.hydra.sweeper.get("_target_", ""))
    if not target.endswith(".BasicSweeper") and not is_search(master):
        raise UserError(f"`attnbench sweep` runs Hydra's basic sweeper (a grid) and Optuna's (hydra/sweeper=optuna); "
                        f"{target} is not supported")
    parsed = sweep_lines(master, app.config_loader)
    if is_search(master):
        parsed, _ = split_search(parsed)
    compose.refuse_search(parsed)
    try:
        grid = hydra_private.sweep_grid(parsed)
    except HydraException as e:
        raise UserError(f"cannot expand the grid: {str(e).strip().splitlines()[0]}") from None
    return grid


def plan_job(composer: compose.JobComposer, overrides: list[str]) -> Job:
    """One job with its job_key, as its launcher composes it (``compose.JobComposer``)."""
    composer.check(overrides)
    with composer.applied(overrides) as cfg:
        try:
            key = job_keys.job_key(composer.resolved(cfg, overrides))
            label, records_path, variant = job_label(cfg), str(cfg.results.path), variant_of(cfg)
        except Exception as e:  # noqa: BLE001 - an interpolation that does not resolve
            raise UserError(f"job '{' '.join(overrides)}': cannot resolve its config: "
                            f"{str(e).splitlines()[0]}") from None
    return Job(list(overrides), key, label, records_path, variant, composer)


@contextmanager
def multirun_config(overrides: list[str], flags: dict | None):
    """(HydraApp, the multirun config) for the time of the ``with``, composed as Hydra's multirun
    composes it (``hydra.mode=MULTIRUN`` added as hydra/_internal/utils.py ``_run_app`` adds it)."""
    from hydra.types import RunMode

    compose.check_group_choices(overrides, allow_sweep=True, allow_search=True)  # interval(): job_overrides judges
    given = {o.split("=", 1)[0] for o in overrides}
    mode = [] if "hydra.mode" in given else ["hydra.mode=MULTIRUN"]
    with compose.hydra_app(JOB_NAME, flags) as app:
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
    with multirun_config(overrides, flags) as (app, master):
        return job_overrides(app, master)


def plan_sweep(overrides: list[str], flags: dict | None = None, progress: bool = False) -> Sweep:
    """The multirun config and its distinct jobs (a grid can name the same config twice, e.g.
    seed=0,0). ``flags``: Hydra's --config-dir / --config-name / --config-path. ``progress``: a
    bar (a line every few seconds without a terminal) when planning takes more than a moment."""
    from bench_cli.core.progress import count_progress

    with multirun_config(overrides, flags) as (app, master):
        grid = job_overrides(app, master)
        composer = compose.JobComposer(app, master)
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
        compose.check_value_types(unique[0].cfg, unique[0].overrides)
    swept = swept_keys(j.overrides for j in unique)
    for job in unique:
        job.swept = swept
    return Sweep(master, unique, dict(flags or {}))


def variant_of(cfg) -> tuple:
    """Jobs checked once for all: same task, dataset and model config (the seeds of one variant;
    not the model's name alone: model.attention.name=a,b are two models of one name)."""
    model = json.dumps(OmegaConf.to_container(cfg.model, resolve=True), sort_keys=True, default=str)
    return cfg.task.name, OmegaConf.select(cfg, "task.dataset", default=None), model


def done_keys(path) -> dict[str, dict]:
    """job_key -> latest ok record."""
    return latest_ok_per_job(csv_store.read_records(path))

