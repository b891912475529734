"""Config composition: the conf/ tree, option listings, and validation of user overrides.

Validation composes the config with Hydra's compose API first, so mistakes become one-line
errors with the valid choices. `run` and `sweep` compose through ``HydraApp`` (Hydra set up as
``@hydra.main`` sets it up), once per run and once per job, and run through Hydra's own job
runner and launchers. Every composition also searches the user's config folders (``--config-dir``,
``hydra.searchpath``: a plugin's model/*.yaml) and imports the plugins its ``plugins`` key names.
"""
from __future__ import annotations

import copy
import functools
import os
import re
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig, ListConfig, OmegaConf, open_dict

from bench_cli.core.errors import UserError, did_you_mean, unknown_choice

CONFIG_NAME = "config"
HYDRA_VERSION_BASE = "1.3"
GROUPS = ("task", "model", "trainer", "logger", "paths", "experiment")


def cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "attnbench"


def per_dataset(option: str, default=None, *, _root_):
    """``${per_dataset:OPTION,DEFAULT}``: a hyperparameter the papers tabulate per (model, dataset),
    e.g. beta of Attention-BN (papers/003, Tables 12-14). Experiment configs hold the tables as
    ``per_dataset.<OPTION>.<model.name>.<task.dataset>``; presets interpolate the value only into
    the variants that take the option, so other variants never see it. DEFAULT when absent."""
    table = OmegaConf.select(_root_, f"per_dataset.{option}", default=None)
    model = OmegaConf.select(_root_, "model.name", default=None)
    dataset = OmegaConf.select(_root_, "task.dataset", default=None)
    if table is None or model not in table or table[model] is None or dataset not in table[model]:
        return default
    return table[model][dataset]


def register_resolvers() -> None:
    if not OmegaConf.has_resolver("attnbench_cache"):
        OmegaConf.register_new_resolver("attnbench_cache", lambda sub="": str(cache_dir() / sub))
    if not OmegaConf.has_resolver("per_dataset"):
        OmegaConf.register_new_resolver("per_dataset", per_dataset)


register_resolvers()


def conf_dir() -> Path:
    import conf

    return Path(conf.__file__).parent


# User config folders (a plugin's model/*.yaml, experiments), searched after conf/ as Hydra
# searches them: those of --config-dir, then those of hydra.searchpath (conf/ wins a name both have).
_CONFIG_DIRS: list[Path] = []
_SEARCHPATH_DIRS: list[Path] = []
# --config-path: a folder whose config.yaml is the root config instead of conf/'s; conf/ is
# searched right after it, so its groups stay available (Hydra alone would drop them).
_CONFIG_PATH: list[Path] = []


def set_config_path(path: str | os.PathLike) -> Path:
    """The --config-path of every command that composes: the root config is DIR/config.yaml."""
    folder = Path(path).expanduser().resolve()
    if not (folder / f"{CONFIG_NAME}.yaml").is_file():
        raise UserError(f"--config-path {path}: no {CONFIG_NAME}.yaml there (--config-path replaces the root "
                        f"config, conf/{CONFIG_NAME}.yaml; to add your own model/*.yaml or experiments use "
                        f"--config-dir {path})")
    _CONFIG_PATH[:] = [folder]
    return folder


def root_dir() -> Path:
    """The folder of the root config: --config-path's, else conf/."""
    return _CONFIG_PATH[0] if _CONFIG_PATH else conf_dir()


def _primary_path() -> str:
    return str(_CONFIG_PATH[0]) if _CONFIG_PATH else "pkg://conf"  # absolute: Hydra takes it as a folder


def add_config_dir(path: str | os.PathLike) -> Path:
    """A folder of configs searched in every composition of this process (the --config-dir of
    every command that composes)."""
    folder = Path(path).expanduser().resolve()
    if not folder.is_dir():
        raise UserError(f"--config-dir {path}: no such directory")
    if folder not in _CONFIG_DIRS:
        _CONFIG_DIRS.append(folder)
    return folder


def config_dirs() -> list[Path]:
    """Where options are looked up, in Hydra's order: --config-path, conf/, --config-dir folders,
    hydra.searchpath."""
    return [*_CONFIG_PATH, conf_dir(), *_CONFIG_DIRS, *_SEARCHPATH_DIRS]


def note_searchpath(overrides: list[str]) -> None:
    """Folders of a ``hydra.searchpath=[file://DIR,...]`` override (Hydra composes with them
    itself), so option listings and checks see their options too."""
    for o in overrides:
        key, _, value = o.partition("=")
        if key.lstrip("+~") != "hydra.searchpath" or not value:
            continue
        for entry in value.strip("[]").split(","):
            entry = entry.strip().strip("'\"")
            if entry.startswith("pkg://") or not entry:
                continue
            folder = Path(entry.removeprefix("file://")).expanduser().resolve()
            if folder.is_dir() and folder not in _SEARCHPATH_DIRS:
                _SEARCHPATH_DIRS.append(folder)


def group_options(group: str) -> list[str]:
    """Options of a config group: yaml files under <config folder>/<group>, nested ones as 'a/b'.
    Files and folders starting with '_' are building blocks included by other options, not options."""
    found: set[str] = set()
    for folder in config_dirs():
        root = folder / group
        if root.is_dir():
            paths = (p.relative_to(root) for p in root.rglob("*.yaml"))
            found.update(str(p.with_suffix("")) for p in paths if not any(part.startswith("_") for part in p.parts))
    return sorted(found)


def option_file(group: str, option: str) -> Path:
    """The yaml of an option: the first config folder that has it (Hydra's search order)."""
    for folder in config_dirs():
        path = folder / group / f"{option}.yaml"
        if path.is_file():
            return path
    return conf_dir() / group / f"{option}.yaml"


def load_option(group: str, option: str) -> DictConfig:
    """One option's YAML, with the same-group options of its defaults list merged under it
    (e.g. model/primalformer extends model/primal). Interpolations are left unresolved."""
    import yaml

    try:
        raw = OmegaConf.load(option_file(group, option))
    except yaml.YAMLError as e:  # a user folder's file: one line naming it
        raise yaml_error(e) from None
    parents = [d for d in raw.pop("defaults", []) if isinstance(d, str) and d != "_self_"]
    return OmegaConf.merge(*(load_option(group, p) for p in parents), raw) if parents else raw


def option_data(group: str, option: str) -> dict:
    """``load_option`` as plain data read by libyaml, without OmegaConf: ten times faster, for a
    listing of many options (`ls models` reads every model's attention names and must answer at
    once, issue 21). YAML's own typing (no interpolation; '1e-3' stays a string): for names."""
    raw = read_yaml(option_file(group, option))
    parents = [d for d in raw.pop("defaults", []) if isinstance(d, str) and d != "_self_"]
    merged: dict = {}
    for parent in [*(option_data(group, p) for p in parents), raw]:
        _merge_into(merged, parent)
    return merged


def _merge_into(base: dict, other: dict) -> dict:
    for key, value in other.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            _merge_into(base[key], value)
        else:
            base[key] = value
    return base


def yaml_error(err: Exception) -> UserError:
    """A YAML error as one line naming the file, its line and the problem."""
    mark = getattr(err, "problem_mark", None)
    where = f"{mark.name}, line {mark.line + 1}" if mark else "a config file"
    problem = getattr(err, "problem", None) or (str(err).strip().splitlines() or [type(err).__name__])[0]
    return UserError(f"YAML error in {where}: {problem}")


def parse_overrides(overrides: list[str]) -> list:
    return [parse_override(o) for o in overrides]


@functools.cache
def _override_parser():
    from hydra.core.override_parser.overrides_parser import OverridesParser

    return OverridesParser.create()


@functools.lru_cache(maxsize=65536)
def parse_override(override: str):
    """One override parsed by Hydra's grammar (as Hydra parses a job's overrides), once per distinct
    line: a sweep's jobs repeat theirs (issue 34). The result is only read."""
    from hydra.errors import OverrideParseException

    try:
        (parsed,) = _override_parser().parse_overrides([override])
    except OverrideParseException as e:
        raise _unparsable(override, e) from None
    return parsed


def _unparsable(override: str, err: Exception) -> UserError:
    """The error of an override Hydra's grammar refuses. A value with characters its unquoted
    values cannot hold (non-ASCII letters, spaces: issue 22 item 15) works quoted: say so, and show
    the quoted form to type."""
    import shlex

    key, eq, value = override.partition("=")
    if eq and value and value[0] not in "'\"" and re.search(r"[^\x21-\x7e]", value):
        quoted = shlex.quote(f'{key}="{value}"' if '"' not in value else f"{key}='{value}'")
        return UserError(f"bad override '{override}': a value with spaces or non-ASCII characters needs "
                         f"quotes in Hydra's override grammar; type it as {quoted}")
    first = str(err).strip().splitlines()[0]
    return UserError(f"bad override '{override}': {first} (expected key=value, +key=value or group=option)")


# Where a new key may be added with `+key=value`: option mappings whose consumer checks every key
# it gets (an attention's constructor, a backbone's, the ListOps generator's), the per-dataset
# tables, Hydra's own config. Anywhere else a new key would be read by nothing, so it is refused
# instead of silently ignored.
ADDABLE = ("model.attention.", "model.final_attention.", "model.cross_attention.", "task.backbone.",
           "task.generator.", "per_dataset.", "hydra.")


def addable(key: str) -> bool:
    return key.startswith(ADDABLE)


# A plain `key=value` (no sweep, quotes or function): what quick_check can judge without Hydra.
_PLAIN_OVERRIDE = re.compile(r"([A-Za-z_][\w.]*)=([\w./-]+)", re.ASCII)


def quick_check(overrides: list[str]) -> None:
    """The commonest mistakes of plain ``key=value`` overrides, found without importing Hydra (that
    alone takes half a second, and a misspelt override answers at once: issue 21): an unknown
    option of a group (``task=uae``) and a top-level key that no config has (``modle=softmax``).
    Same messages as the full checks (``check_group_choices``, ``_explain``), which judge the rest."""
    for o in overrides:
        m = _PLAIN_OVERRIDE.fullmatch(o)
        if not m or m.group(2) == "null":
            continue
        key, value = m.groups()
        if key in GROUPS and value not in group_options(key):
            raise unknown_choice(key, value, group_options(key))
        if key.split(".")[0] not in top_level_keys():  # no config has it: Hydra would refuse it too
            raise UserError(f"unknown config key '{key}'{key_hint({}, key)}")  # nothing composed: the top level


def top_level_keys() -> set[str]:
    """Every top-level key a composed config can have (a superset): the root config's, the config
    groups', and those of options packaged elsewhere (``# @package _global_`` experiments)."""
    return _top_level_keys(tuple(config_dirs()))


@functools.lru_cache(maxsize=8)
def _top_level_keys(folders: tuple[Path, ...]) -> set[str]:
    import yaml

    def keys_of(stream) -> list[str]:  # the document's node tree only: constructing it costs more
        node = yaml.compose(stream, Loader=_yaml_loader())
        return [k.value for k, _ in node.value] if isinstance(node, yaml.MappingNode) else []

    keys = {"hydra", *root_config().keys()}
    for folder in folders:
        keys.update(d.name for d in folder.iterdir() if d.is_dir() and not d.name.startswith("_"))
        for path in folder.rglob("*.yaml"):
            with path.open() as f:
                package = re.match(r"\s*#\s*@package\s+(\S+)", f.readline())
                if package and package.group(1) == "_global_":
                    keys.update(keys_of(f))
                elif package:
                    keys.add(package.group(1).split(".")[0])
    keys.discard("defaults")  # a _global_ experiment's defaults list, not a config key
    return keys


def _yaml_loader():
    import yaml

    return getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml when built with it: ten times faster


def read_yaml(path: Path) -> dict:
    """A YAML file as plain data (YAML's own typing: no interpolation, '1e-3' stays a string), read
    without OmegaConf for the checks and listings that answer at once (issue 21). A YAML error is
    one line naming the file and its line."""
    import yaml

    try:
        with path.open() as f:
            return yaml.load(f, Loader=_yaml_loader()) or {}
    except yaml.YAMLError as e:
        raise yaml_error(e) from None


def root_config() -> dict:
    """conf/config.yaml as plain data (``read_yaml``)."""
    return read_yaml(root_dir() / f"{CONFIG_NAME}.yaml")


def root_default(group: str) -> str:
    """The option of ``group`` the root config's defaults list selects."""
    return next(d[group] for d in root_config()["defaults"] if isinstance(d, dict) and group in d)


def experiment_tasks(name: str) -> list[str]:
    """The tasks experiment ``name`` is for (issue 22 item 13), read from its YAML and its parents'
    (no Hydra): those its sweep runs over (``hydra.sweeper.params.task``) and the one it selects
    (``override /task: X``), else the root config's default task."""
    selected, swept = _experiment_task_settings(name)
    return sorted({selected or root_default("task"), *swept})


def _defaults_entry(entry, base: str) -> tuple[str, str | None, list[str] | None] | None:
    """One entry of a defaults list as Hydra reads it (hydra/_internal/config_repository.py
    ``_create_defaults_list``): (its config or group path from the config root, its ``@package``,
    the options of a group entry -- None for a config entry). Relative paths start from ``base``;
    ``optional``/``override`` do not change what is selected. None: ``_self_``."""
    if entry == "_self_":
        return None
    if isinstance(entry, dict) and len(entry) == 1:
        (key, value), = entry.items()
        key = str(key).split()[-1]
        options = [] if value is None else [str(v) for v in value] if isinstance(value, list) else [str(value)]
    else:
        key, options = str(entry), None
    path, _, package = key.partition("@")
    return (path[1:] if path.startswith("/") else f"{base}/{path}"), package.split(":")[0] or None, options


# The packages of a task entry that still put the option at cfg.task (experiments are `_global_`).
TASK_PACKAGES = (None, "task", "_group_", "_global_.task")


def _experiment_task_settings(name: str) -> tuple[str | None, list[str]]:
    """(the task an experiment's defaults select, the tasks its sweep runs over), read from its YAML
    and its parent experiments' as Hydra composes them (``_task_settings_of``)."""
    selected, swept = _task_settings_of(f"experiment/{name}", "experiment")
    return selected, swept or []


def _task_settings_of(config: str, base: str) -> tuple[str | None, list[str] | None]:
    """(selected task, swept tasks or None) of the experiment file at ``config`` (experiment/...),
    its relative defaults starting from ``base``. A parent is a config entry under experiment/
    (``- parent``, ``- /experiment/parent``, ``@package`` forms; its own relative entries start from
    its folder) or an experiment group entry (``- /experiment/sub: parent``, ``sub: [a, b]``); a task
    is a ``task`` group entry (``override /task: x``, ``optional override /task@task: x``, a list: its
    last). The file's own task entry wins, then the last parent's (hydra/_internal/defaults_list.py
    keeps the first override it meets: a list's own entries, then its children last first); of the
    sweeps' ``task``, the one merged last (the file after its parents unless ``_self_`` is earlier)."""
    file = option_file(*config.split("/", 1))
    if not file.is_file():   # an optional parent that is absent, or a typo Hydra reports when it composes
        return None, None
    raw = read_yaml(file)
    params = ((raw.get("hydra") or {}).get("sweeper") or {}).get("params") or {}
    own = (None, [t.strip() for t in str(params["task"]).split(",")] if "task" in params else None)
    parts = _swept_part_tasks(params)
    if parts:   # a sweep over experiment parts (zoo/offline's cases) runs every task those parts select
        own = (None, sorted({*(own[1] or []), *parts}))
    selected, merged, self_listed = None, [], False   # merged: (selected, swept) in merge order
    for entry in raw.get("defaults") or []:
        parsed = _defaults_entry(entry, base)
        if parsed is None:
            merged.append(own)
            self_listed = True
            continue
        path, package, options = parsed
        if options is None and path.startswith("experiment/"):
            merged.append(_task_settings_of(path, path.rsplit("/", 1)[0]))
        elif options is not None and (path == "experiment" or path.startswith("experiment/")):
            merged += [_task_settings_of(f"{path}/{option}", path) for option in options]
        elif options and path == "task" and package in TASK_PACKAGES:
            selected = selected or options[-1]
    if not self_listed:
        merged.append(own)   # Hydra puts an unlisted _self_ last
    selected = selected or next((s for s, _ in reversed(merged) if s), None)
    return selected, next((w for _, w in reversed(merged) if w is not None), None)


def _swept_part_tasks(params: dict) -> set[str]:
    """The tasks selected or swept by the options of the experiment groups a sweep runs over
    (``experiment/zoo/_case: a,b``: each option is an experiment part with its own task)."""
    tasks = set()
    for key, value in params.items():
        if str(key).startswith("experiment/"):
            for option in str(value).split(","):
                selected, swept = _task_settings_of(f"{key}/{option.strip()}", str(key))
                tasks.update([selected] if selected else [], swept or [])
    return tasks


def check_experiment_tasks(experiments: list[str], tasks: list[str]) -> None:
    """A ``task=`` an experiment is not for is one line saying so, before any other suggestion
    (issue 22 item 13: the experiment's settings would fail later on the other task's model)."""
    for experiment in experiments:
        meant = experiment_tasks(experiment)
        for task in tasks:
            if task in meant:
                continue
            others = [e for e in group_options("experiment") if task in experiment_tasks(e)]
            hint = (f"experiments for {task}: {', '.join(others)}" if others
                    else f"no experiment is for {task}: run it without experiment=")
            raise UserError(f"experiment {experiment} is for task{'s' if len(meant) > 1 else ''} "
                            f"{', '.join(meant)}, not {task} (its settings are for {'them' if len(meant) > 1 else 'it'}); "
                            f"{hint}")


def check_group_choices(overrides: list[str], allow_sweep: bool = False, allow_search: bool = False) -> None:
    """Unknown group options ('model=no_such_model') list the valid choices; ``+key`` outside the
    keys that are read (``ADDABLE``) is refused; a task the experiment is not for is refused.
    Hydra's sweep syntaxes (comma lists, choice, range, glob) are `sweep`'s alone, interval an
    Optuna sweep's alone (``allow_search``: `sweep` checks its sweeper once composed, refuse_search)."""
    note_searchpath(overrides)
    quick_check(overrides)  # a misspelt key is refused before Hydra is imported
    from hydra.core.override_parser.types import Glob

    chosen: dict[str, list[str]] = {"task": [], "experiment": []}
    for o in parse_overrides(overrides):
        if (o.is_add() or o.is_force_add()) and "." in o.key_or_group and not addable(o.key_or_group):
            raise UserError(f"'{o.input_line}': nothing reads {o.key_or_group}, so adding it would change nothing; "
                            f"new keys can be added only under {', '.join(a + '*' for a in ADDABLE)}"
                            f"{_existing_hint(o.key_or_group, overrides)}")
        if ((o.is_add() or o.is_force_add()) and "." not in o.key_or_group and o.key_or_group not in GROUPS
                and not any((d / o.key_or_group.split("@")[0]).is_dir() for d in config_dirs())):  # a config group
            raise UserError(f"'{o.input_line}': nothing reads a top-level key {o.key_or_group}; "
                            f"new keys can be added only under {', '.join(a + '*' for a in ADDABLE)}")
        key = o.key_or_group
        if o.is_interval_sweep() and not allow_search:
            refuse_search([o])
        if isinstance(o.value(), Glob) and key.split("@")[0] not in GROUPS:  # Hydra would expand it to nothing
            raise UserError(f"'{o.input_line}': glob() selects options of a config group ({', '.join(sorted(GROUPS))}); "
                            f"for the values of {key} give them as a comma list or choice()")
        if o.is_sweep_override() and not allow_sweep:
            raise UserError(f"'{o.input_line}' is a sweep (comma list, choice, range, glob); use `attnbench sweep` "
                            "for several values")
        if key.startswith("hydra") or o.is_delete():
            continue
        group = key.split("@")[0]
        if group in GROUPS and "." not in group:
            if isinstance(o.value(), Glob):  # glob(...) of a group: the options it matches (Hydra needs a loader)
                values = o.value().filter(group_options(group))
                if not values:
                    raise UserError(f"'{o.input_line}' matches no {group}; {group} options: "
                                    f"{', '.join(group_options(group))}")
            else:
                values = list(o.sweep_string_iterator()) if o.is_sweep_override() else [o.value()]
            for v in values:
                if v is None and group == "experiment":
                    continue
                if str(v) not in group_options(group):
                    raise unknown_choice(group, str(v), group_options(group))
                if group in chosen:
                    chosen[group].append(str(v))
    check_experiment_tasks(chosen["experiment"], chosen["task"])


def refuse_search(parsed: list) -> None:
    """interval() outside an Optuna sweep: one line, the same in every command (nothing but a
    search sweeper samples a value from a range)."""
    for o in parsed:
        if o.is_interval_sweep():
            raise UserError(f"'{o.input_line}': interval() is for search sweepers (Optuna): "
                            "`attnbench sweep hydra/sweeper=optuna ...` samples it (docs/tuning.md); a grid takes "
                            "comma lists, choice(), range() and glob()")


def chosen_experiments_and_tasks(parsed: list) -> tuple[list[str], list[str]]:
    """(the experiments, the tasks) that parsed overrides choose, as ``check_experiment_tasks`` takes them."""
    chosen: dict[str, list[str]] = {"experiment": [], "task": []}
    for o in parsed:
        group = o.key_or_group.split("@")[0]
        if group in chosen and not o.is_delete():
            values = list(o.sweep_string_iterator()) if o.is_sweep_override() else [o.value()]
            chosen[group] += [str(v) for v in values if v is not None or group != "experiment"]
    return chosen["experiment"], chosen["task"]


@contextmanager
def composer():
    """A Hydra compose session over conf/ (and the --config-dir folders): yields
    ``compose_one(overrides, with_hydra=False)``, which turns composition errors into one-line
    UserErrors. Compositions inside one session share its initialisation (a sweep composes many
    jobs). The plugins a composed config names (``plugins:``) are imported before it is returned."""
    from hydra import compose as hydra_compose
    from hydra._internal.hydra import Hydra
    from hydra.core.global_hydra import GlobalHydra

    def compose_one(overrides: list[str], with_hydra: bool = False) -> DictConfig:
        try:
            cfg = hydra_compose(config_name=CONFIG_NAME, overrides=overrides, return_hydra_config=with_hydra)
        except composition_errors() as e:
            raise _explain(e, overrides) from None
        return _with_plugins(cfg)

    GlobalHydra.instance().clear()
    try:  # as hydra.initialize_config_module(config_module="conf", job_name="app") sets Hydra up
        _setbase()
        Hydra.create_main_hydra2(task_name="app", config_search_path=_search_path("conf.app", _primary_path()))
        yield compose_one
    finally:
        GlobalHydra.instance().clear()


@contextmanager
def shared_config_files():
    """For the time of the ``with``, every config file is parsed once, not once per composition.

    Hydra's CachingConfigRepository lives for one composition, so a sweep that composes hundreds of
    jobs parses the same files hundreds of times. Here each file's parsed result is kept per search
    path and handed out as a deep copy (Hydra edits what it loads): a third less planning time, the
    same configs (tests/test_sweep.py). Only worth it for many compositions: one composition pays the
    copies on top of the parsing."""
    from hydra._internal.config_repository import ConfigRepository

    original, parsed = ConfigRepository.load_config, {}

    def load_config(self, config_path: str):
        key = (tuple((source.provider, source.path) for source in self.sources), config_path)
        if key not in parsed:
            parsed[key] = original(self, config_path)
        return copy.deepcopy(parsed[key])

    ConfigRepository.load_config = load_config
    try:
        yield
    finally:
        ConfigRepository.load_config = original


@contextmanager
def shared_interpolation_parses():
    """For the time of the ``with``, OmegaConf parses each interpolation string once, not each time
    it resolves it: its grammar parser (ANTLR) was most of the time of a sweep job's ``job_key``
    (issue 34). The parse trees are only read by the resolution, so one serves every config."""
    from omegaconf import base

    original = base.parse
    base.parse = functools.lru_cache(maxsize=4096)(original)
    try:
        yield
    finally:
        base.parse = original


def composition_errors() -> tuple[type[Exception], ...]:
    """What a composition raises for a mistake in the configs: Hydra's errors, and YAML errors of a
    file (a user folder's yaml is read as it is found)."""
    import yaml
    from hydra.errors import HydraException

    return HydraException, yaml.YAMLError


def _setbase() -> None:
    from hydra import version

    version.setbase(HYDRA_VERSION_BASE)  # as @hydra.main(version_base=...) does


def _search_path(calling_module: str, config_path: str, config_dir: str | None = None):
    """Hydra's search path for a function of ``calling_module`` with ``config_path``, with the
    --config-dir folders added as hydra/_internal/utils.py ``_run_hydra`` (add_conf_dir) adds one."""
    from hydra._internal.utils import create_automatic_config_search_path
    from hydra.core.config_search_path import SearchPathQuery

    search_path = create_automatic_config_search_path(None, calling_module, config_path)
    if _CONFIG_PATH:  # after the root config's folder (the main entry): conf/'s groups
        search_path.prepend(provider="attnbench", path="pkg://conf", anchor=SearchPathQuery(provider="schema"))
    folders = [add_config_dir(config_dir)] if config_dir else []
    for folder in [*folders, *(d for d in _CONFIG_DIRS if d not in folders)]:
        search_path.prepend(provider="command-line", path=f"file://{folder}", anchor=SearchPathQuery(provider="schema"))
    return search_path


def _with_plugins(cfg: DictConfig) -> DictConfig:
    """``cfg`` after importing the plugins its ``plugins`` key names (before any validation)."""
    from bench_cli.config import plugins

    plugins.import_configured(cfg)
    return cfg


def compose_unchecked(overrides: list[str], with_hydra: bool = False) -> DictConfig:
    """Compose without the checks of ``compose`` (sweep grids, report lookups, error hints)."""
    with composer() as compose_one:
        return compose_one(overrides, with_hydra)


def compose_for_listing(overrides: list[str]) -> DictConfig:
    """The config `ls` reads (``paths``, ``plugins``). Without overrides it is read without Hydra:
    the root config's own keys and its ``paths`` option, as composing them gives (Hydra's
    composition costs most of a second, and `ls` answers at once: issue 21). tests/test_cli.py
    checks it equals the composed one."""
    if overrides:
        return compose(overrides)
    keys = {k: v for k, v in root_config().items() if k not in ("defaults", "hydra")}
    cfg = OmegaConf.create({**keys, "paths": option_data("paths", root_default("paths"))})
    return _with_plugins(cfg)


def compose(overrides: list[str], with_hydra: bool = False) -> DictConfig:
    """Compose conf/ with overrides (no sweeps), turning composition errors into one-line UserErrors.

    Values are checked against the type of the default they replace (an integer stays an
    integer, a list a list), so a typo fails here instead of deep inside a run.
    """
    check_group_choices(overrides)
    with replaced_defaults(overrides) as defaults:
        cfg = compose_unchecked(overrides, with_hydra)
    check_value_types(cfg, overrides, defaults)
    return cfg


# --- running through Hydra ------------------------------------------------------------------------
def dispatch_to_hydra(entry, args: list[str]) -> None:
    """Call a ``@hydra.main`` function as if from the command line (``sys.argv`` rewritten): for
    Hydra's own flags (--cfg, --info, --help), which print and run nothing. The --config-dir the
    CLI took (``add_config_dir``) is handed on (Hydra takes one)."""
    import sys

    given = {"--config-dir", "-cd"} & {a.split("=", 1)[0] for a in args}
    extra = ["--config-path", str(_CONFIG_PATH[0]), "--config-dir", str(conf_dir())] if _CONFIG_PATH else []
    extra += ["--config-dir", str(_CONFIG_DIRS[0])] if _CONFIG_DIRS and not given and not _CONFIG_PATH else []
    sys.argv = ["attnbench", *extra, *args]
    entry()


@dataclass
class HydraApp:
    """Hydra set up over conf/ as ``@hydra.main(config_path="pkg://conf")`` sets it up for a
    function of module ``bench_cli.<job_name>`` (hydra/_internal/utils.py ``_run_hydra``), with
    Hydra's --config-path, --config-dir and --config-name flags: `run` and `sweep` compose and run
    through it instead of going through ``@hydra.main``, so that they compose each job once."""
    hydra: object  # hydra._internal.hydra.Hydra
    config_name: str

    @property
    def config_loader(self):
        return self.hydra.config_loader

    def compose(self, overrides: list[str], run_mode, with_log_configuration: bool = False) -> DictConfig:
        """The config with its hydra node, as Hydra's run (RunMode.RUN) or multirun composes it."""
        try:
            cfg = self.hydra.compose_config(config_name=self.config_name, overrides=overrides, run_mode=run_mode,
                                            with_log_configuration=with_log_configuration)
        except composition_errors() as e:
            raise _explain(e, overrides) from None
        return _with_plugins(cfg)

    def compose_job(self, master: DictConfig, overrides: list[str]) -> DictConfig:
        """One job of a multirun, composed as every Hydra launcher composes it (``load_sweep_config``)."""
        try:
            cfg = self.config_loader.load_sweep_config(master, list(overrides))
        except composition_errors() as e:
            raise _explain(e, overrides) from None
        return _with_plugins(cfg)


@contextmanager
def hydra_app(job_name: str, flags: dict | None = None):
    """A ``HydraApp`` for the time of the ``with`` (Hydra's global state set, then cleared);
    ``flags`` are Hydra's flags as ``bench_cli.config.args.Parsed.hydra`` holds them."""
    from hydra._internal.hydra import Hydra
    from hydra.core.global_hydra import GlobalHydra

    _setbase()
    flags = flags or {}
    if flags.get("--config-path") or flags.get("-cp"):
        set_config_path(str(flags.get("--config-path") or flags.get("-cp")))
    config_path = _primary_path()
    config_dir = flags.get("--config-dir") or flags.get("-cd")
    search_path = _search_path(f"bench_cli.{job_name}", str(config_path), str(config_dir) if config_dir else None)
    GlobalHydra.instance().clear()  # a composition of the checks may have left one
    try:
        hydra = Hydra.create_main_hydra2(task_name=job_name, config_search_path=search_path)
        yield HydraApp(hydra, str(flags.get("--config-name") or flags.get("-cn") or CONFIG_NAME))
    finally:
        GlobalHydra.instance().clear()


class JobComposer:
    """The jobs of a multirun as every Hydra launcher composes them (``HydraApp.compose_job``), with
    one Hydra composition per distinct combination of config choices instead of one per job.

    Hydra builds the defaults list from the overrides that name a config group and applies every
    other override to the composed config afterwards, in their order, with one function
    (hydra/_internal/config_loader_impl.py ``_load_configuration_impl``: ``config_overrides`` ->
    ``_apply_overrides_to_config``; hydra/_internal/defaults_list.py ``Overrides`` splits them by
    ``group_exists``). So a job is the composition of its group choices with its value overrides
    (seed, a learning rate, ``model.attention.beta``; additions and deletions of keys too) applied
    by that same function: the same config, a few milliseconds instead of a composition (issue 34;
    tests/test_sweep.py compares every committed experiment with whole compositions). A job that
    overrides Hydra's own config (which can move the search path) is composed whole. Configs have
    no ``hydra`` node, as ``hydra.core.utils.run_job`` hands them to the job."""

    def __init__(self, app: HydraApp, master: DictConfig):
        self.app, self.master = app, master
        # the repository of the jobs' compositions (its search path has the config's hydra.searchpath)
        _, self._repo = app.config_loader._parse_overrides_and_create_caching_repo(
            master.hydra.job.config_name, OmegaConf.to_container(master.hydra.overrides.hydra))
        self._parsed: dict[str, tuple[str, object]] = {}  # override line -> (its kind, Hydra's Override)
        self._bases: dict[tuple[str, ...], DictConfig] = {}  # config choices -> their composition
        self._unresolved: dict[tuple[str, ...], tuple | None] = {}  # config choices -> _unresolved_template
        self._checked: set = set()  # override lines and choice tuples that check_group_choices passed

    def _kind(self, line: str) -> tuple[str, object]:
        """('hydra' | 'choice' | 'value', the parsed override), once per distinct line."""
        if line not in self._parsed:
            o = parse_override(line)
            kind = "hydra" if o.is_hydra_override() else "choice" if self._repo.group_exists(o.key_or_group) else "value"
            self._parsed[line] = kind, o
        return self._parsed[line]

    def split(self, overrides) -> tuple[tuple[str, ...], list]:
        """(the overrides Hydra composes with, the parsed value overrides applied after)."""
        kinds = [self._kind(line) for line in overrides]
        if any(kind == "hydra" for kind, _ in kinds):
            return tuple(overrides), []
        return (tuple(line for line, (kind, _) in zip(overrides, kinds) if kind == "choice"),
                [o for kind, o in kinds if kind == "value"])

    def check(self, overrides) -> None:
        """``check_group_choices`` of a job: it judges each override alone, except whether the
        experiment is for the task; so each distinct override once, the experiment and the task once
        per combination of choices. A refusal is the whole job's message."""
        choices, _ = self.split(overrides)
        try:
            for line in overrides:
                if line not in self._checked:
                    check_group_choices([line])
                    self._checked.add(line)
            if choices not in self._checked:
                check_experiment_tasks(*chosen_experiments_and_tasks([self._kind(line)[1] for line in choices]))
                self._checked.add(choices)
        except UserError:
            check_group_choices(list(overrides))
            raise

    def _base(self, choices: tuple[str, ...]) -> DictConfig:
        if choices not in self._bases:
            from omegaconf import read_write

            cfg = self.app.compose_job(self.master, list(choices))
            with read_write(cfg), open_dict(cfg):
                del cfg["hydra"]
            self._bases[choices] = cfg
        return self._bases[choices]

    def prepare(self, grid, fork_from: int = 16, progress=None) -> None:
        """Compose the choices of every job of ``grid`` ahead, shared between this process and
        forked ones (one per further core, each taking the next combination left; their configs
        come back pickled) when there are at least ``fork_from`` to compose: the zoo's 150
        compositions are most of its plan. What fails here is left to the jobs, which compose it
        again and fail in the grid's order. ``progress(done, total)`` is called as they are taken."""
        import multiprocessing

        todo = list(dict.fromkeys(c for c in (self.split(job)[0] for job in grid) if c not in self._bases))
        workers = min(len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1, 4)
        if workers < 2 or len(todo) < fork_from or "fork" not in multiprocessing.get_all_start_methods():
            return
        context = multiprocessing.get_context("fork")
        taken = context.Value("i", 0)  # how many of ``todo`` a process has taken
        children = []
        for _ in range(workers - 1):
            receive, send = context.Pipe(duplex=False)
            child = context.Process(target=self._compose_taken, args=(todo, taken, send), daemon=True)
            child.start()
            send.close()
            children.append((receive, child))
        self._compose_taken(todo, taken, None, progress)
        for receive, child in children:
            try:
                composed = receive.recv()
            except EOFError:  # the child died: what it took is composed as the jobs need it
                composed = {}
            child.join()
            self._bases.update({c: cfg for c, cfg in composed.items() if c not in self._bases})

    def _compose_taken(self, todo: list[tuple[str, ...]], taken, send, progress=None) -> None:
        composed = {}
        while True:
            with taken.get_lock():
                i = taken.value
                taken.value += 1
            if progress is not None:
                progress(min(i, len(todo)), len(todo))
            if i >= len(todo):
                break
            try:
                composed[todo[i]] = self._base(todo[i])
            except Exception:  # noqa: BLE001 - raised again in the grid's order (prepare)
                pass
        if send is not None:
            send.send(composed)
            send.close()

    def compose(self, overrides) -> DictConfig:
        """The job's config, its own object."""
        choices, values = self.split(overrides)
        return self._apply(copy.deepcopy(self._base(choices)), values, overrides)

    @contextmanager
    def applied(self, overrides):
        """The job's config for the time of the ``with``, read-only, to keep nothing of: the shared
        composition of its choices with its values set in place and reset afterwards when each
        replaces a plain value by a plain value (no copy: most of a sweep), else ``compose``'s."""
        from omegaconf import flag_override

        choices, values = self.split(overrides)
        base = self._base(choices)
        replaced = _replaced_values(base, values)
        if replaced is not None and choices not in self._unresolved:  # read before any value is set
            self._unresolved[choices] = _unresolved_template(base)
        try:
            cfg = self._apply(copy.deepcopy(base) if replaced is None else base, values, overrides)
            with flag_override(cfg, "readonly", True):
                yield cfg
        finally:
            for node, value in reversed(replaced or ()):  # a key overridden twice gets its first value back
                node._set_value(value)

    def resolved(self, cfg: DictConfig, overrides) -> dict:
        """``OmegaConf.to_container(cfg, resolve=True)`` of a job's config from ``applied``, resolving
        only what can differ from the other jobs of its choices: its interpolations (an override
        they read, a resolver reading the root) and its values; the rest is the composition's,
        read once (a job's job_key in a fraction of a millisecond). The same data, or OmegaConf's
        error when something does not resolve."""
        from omegaconf.basecontainer import BaseContainer

        choices, values = self.split(overrides)
        template = self._unresolved.get(choices)
        if template is None or self._bases.get(choices) is not cfg:  # not resolved in place: whole
            return OmegaConf.to_container(cfg, resolve=True)
        raw, interpolations = template
        out, copied = dict(raw), set()
        try:
            for path in [*interpolations, *(tuple(o.key_or_group.split(".")) for o in values)]:
                node = cfg
                for key in path:
                    node = node._get_node(key)
                node = node._dereference_node()
                value = (BaseContainer._to_content(node, resolve=True, throw_on_missing=False)
                         if isinstance(node, (DictConfig, ListConfig)) else node._value())
                _set_copied(out, path, value, copied)
        except Exception:  # noqa: BLE001 - OmegaConf's own message, from resolving it whole
            return OmegaConf.to_container(cfg, resolve=True)
        return out

    @staticmethod
    def _apply(cfg: DictConfig, values: list, overrides) -> DictConfig:
        from hydra._internal.config_loader_impl import ConfigLoaderImpl

        try:
            ConfigLoaderImpl._apply_overrides_to_config(values, cfg)
        except composition_errors() as e:
            raise _explain(e, list(overrides)) from None
        return _with_plugins(cfg)


def _unresolved_template(cfg: DictConfig) -> tuple[dict, list[tuple]] | None:
    """(``OmegaConf.to_container(cfg)`` unresolved, the paths of its interpolations), or None for a
    config whose resolution is not the sum of its leaves' (a container that is null, missing, an
    interpolation or a structured config)."""
    paths: list[tuple] = []

    def walk(node, path: tuple) -> bool:
        for key in (node.keys() if isinstance(node, DictConfig) else range(len(node))):
            child = node._get_node(key)
            if isinstance(child, (DictConfig, ListConfig)):
                if (child._is_none() or child._is_missing() or child._is_interpolation()
                        or isinstance(child, DictConfig) and child._metadata.object_type not in (dict, None)
                        or not walk(child, (*path, key))):
                    return False
            elif child._is_interpolation():
                paths.append((*path, key))
        return True

    return (OmegaConf.to_container(cfg), paths) if walk(cfg, ()) else None


def _set_copied(tree: dict, path: tuple, value, copied: set) -> None:
    """``tree[path] = value``, copying the dicts and lists on the way (once: ``copied`` holds the
    ids of the copies) instead of changing those ``tree`` shares with its template."""
    node = tree
    for key in path[:-1]:
        child = node[key]
        if id(child) not in copied:
            child = dict(child) if isinstance(child, dict) else list(child)
            copied.add(id(child))
            node[key] = child
        node = child
    node[path[-1]] = value


def _replaced_values(cfg: DictConfig, values: list) -> list | None:
    """(node, its value) of the leaf each value override replaces, when every override is a plain
    ``key=value`` whose value is a string, number or boolean at an existing key of ``cfg`` holding
    one (an untyped node: OmegaConf sets its value in place, ``BaseContainer._set_item_impl``);
    None otherwise (additions, deletions, null, lists, mappings, new keys)."""
    from omegaconf.nodes import AnyNode

    replaced = []
    for o in values:
        if o.is_add() or o.is_force_add() or o.is_delete() or type(o.value()) not in (str, int, float, bool):
            return None
        node = cfg
        for part in o.key_or_group.split("."):
            node = node._get_node(part, validate_access=False) if isinstance(node, DictConfig) else None
        if type(node) is not AnyNode:
            return None
        replaced.append((node, node._value()))
    return replaced


RUN_JOB_NAME = "attnbench"  # hydra.job.name of `attnbench run`: its log file is <run folder>/attnbench.log


def compose_run(overrides: list[str]) -> DictConfig:
    """The config of one `attnbench run`, with its hydra node, composed once: validation and the
    run use this same object (``run_job``)."""
    check_group_choices(overrides)
    from hydra.types import RunMode

    with hydra_app(RUN_JOB_NAME) as app, replaced_defaults(overrides) as defaults:
        cfg = app.compose(overrides, RunMode.RUN, with_log_configuration=True)
    check_value_types(cfg, overrides, defaults)
    return cfg


def run_job(cfg: DictConfig, task_function) -> object:
    """Run ``task_function(cfg)`` with the config ``compose_run`` made, as Hydra's run mode does
    (hydra/_internal/hydra.py ``Hydra.run``: callbacks, output folder from ``hydra.run.dir``,
    HydraConfig, job logging).

    Not ``Hydra.run`` itself: it composes the config from the overrides, so `attnbench run` would
    compose twice (once to check the config before anything is created, once to run) or check it
    only inside the job, after Hydra has made the run folder, so a mistake would leave a folder
    behind and the run id of a distributed run (decided from the composed config, and part of
    ``hydra.run.dir``) could not be set first. Only the composition differs from ``Hydra.run``."""
    from hydra._internal.callbacks import Callbacks
    from hydra.core.utils import run_job as hydra_run_job
    from hydra.types import HydraContext, RunMode

    with hydra_app(RUN_JOB_NAME) as app:
        with open_dict(cfg.hydra):
            cfg.hydra.mode = RunMode.RUN
        callbacks = Callbacks(cfg)
        callbacks.on_run_start(config=cfg, config_name=app.config_name)
        ret = hydra_run_job(hydra_context=HydraContext(config_loader=app.config_loader, callbacks=callbacks),
                            task_function=task_function, config=cfg, job_dir_key="hydra.run.dir",
                            job_subdir_key=None, configure_logging=True)
        callbacks.on_run_end(config=cfg, config_name=app.config_name, job_return=ret)
        return ret.return_value  # re-raises the task's exception


_TYPE_NAMES = {bool: "true or false", int: "an integer", float: "a number", list: "a list", dict: "a mapping"}


@functools.lru_cache(maxsize=128)
def _group_defaults(groups: tuple[str, ...]) -> DictConfig:
    """The config of the group choices alone, whose values the value overrides replace. Cached:
    conf/ does not change within a process, a sweep's jobs share their groups, and the result is
    only read."""
    return compose_unchecked(list(groups))


def _value_overrides(parsed: list) -> list:
    """The overrides that replace a value (``key=value``): not a group choice, an addition, a
    deletion or Hydra's own setting."""
    return [o for o in parsed if o.key_or_group not in GROUPS and not o.is_delete()
            and not o.key_or_group.startswith("hydra") and o.is_force_add() is False and o.is_add() is False]


def _plain(value):
    return OmegaConf.to_container(value) if OmegaConf.is_config(value) else value


@contextmanager
def replaced_defaults(overrides: list[str]):
    """Within it, a composition of ``overrides`` records the default each value override replaces:
    Hydra merges the defaults list, then applies the value overrides (hydra/_internal/
    config_loader_impl.py ``_load_configuration_impl`` -> ``_apply_overrides_to_config``); the values
    are read just before, from that one composition. ``check_value_types`` then needs no second
    composition of the group choices alone (a quarter of a second per run: issue 21). Yields
    key -> default as plain data; a key whose default could not be read is left out (composed then)."""
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from omegaconf.errors import OmegaConfBaseException

    keys = [o.key_or_group for o in _value_overrides(parse_overrides(overrides))]
    defaults: dict = {}
    apply = ConfigLoaderImpl.__dict__.get("_apply_overrides_to_config")  # a staticmethod in Hydra 1.3
    if not keys or not isinstance(apply, staticmethod):  # another Hydra: check_value_types composes instead
        yield defaults
        return

    def record_then_apply(config_overrides, cfg) -> None:
        defaults.clear()  # the last composition's (an error's hint composes others)
        for key in keys:
            try:
                defaults[key] = _plain(OmegaConf.select(cfg, key, throw_on_missing=False))
            except OmegaConfBaseException:
                pass
        apply.__func__(config_overrides, cfg)

    ConfigLoaderImpl._apply_overrides_to_config = staticmethod(record_then_apply)
    try:
        yield defaults
    finally:
        ConfigLoaderImpl._apply_overrides_to_config = apply


def check_value_types(cfg: DictConfig, overrides: list[str], defaults: dict | None = None) -> None:
    """Each value override has the type of the default it replaces. ``defaults``: those recorded
    while ``cfg`` was composed (``replaced_defaults``); the others are read from a composition of
    the group choices alone."""
    parsed = parse_overrides(overrides)
    groups = [o.input_line for o in parsed if o.key_or_group in GROUPS or o.key_or_group == "hydra.searchpath"]
    values = _value_overrides(parsed)
    if not values:
        return
    defaults = defaults or {}
    for o in values:
        key = o.key_or_group
        default = (defaults[key] if key in defaults else
                   _plain(OmegaConf.select(_group_defaults(tuple(groups)), key, throw_on_missing=False)))
        if default is None or isinstance(default, str):
            continue
        new = _plain(OmegaConf.select(cfg, key, throw_on_missing=False))
        expected = type(default)
        ok = (new is None or isinstance(new, expected) and not (expected is int and isinstance(new, bool))
              or expected is float and isinstance(new, int) and not isinstance(new, bool))
        if not ok:
            raise UserError(f"bad value for {key}: {o.input_line.split('=', 1)[1]!r} "
                            f"(expected {_TYPE_NAMES.get(expected, expected.__name__)}, like the default {default!r})")


def key_hint(config, key: str, list_keys: bool = True) -> str:
    """For a dotted key ``config`` lacks, about its first missing part: " (did you mean
    'trainer.max_epochs'?)" when an existing key there is close, else (``list_keys``) the keys that
    are there ("; keys of trainer: ..."; at the top level both: "; top-level keys: ...")."""
    parts = key.split(".")
    node, depth = config, 0
    while depth < len(parts) - 1 and isinstance(node, (dict, DictConfig)) and parts[depth] in node:
        try:
            node, depth = node[parts[depth]], depth + 1
        except Exception:  # an interpolation that cannot be resolved here
            return ""
    if not isinstance(node, (dict, DictConfig)):
        return ""
    prefix = ".".join(parts[:depth])
    # at the top level, the keys any composition can have (a superset of the composed config's), so
    # the quick check, which composes nothing, and Hydra's refusal say the same
    keys = sorted(str(k) for k in node.keys()) if prefix else sorted(top_level_keys())
    close = did_you_mean(parts[depth], keys)
    if prefix:
        close = close.replace("'", f"'{prefix}.", 1)
        return close or (f"; keys of {prefix}: {', '.join(keys)}" if list_keys else "")
    # at the top level names are short and a close one is often not the one meant: list them too
    return close + (f"; top-level keys: {', '.join(keys)}" if list_keys else "")


def _existing_hint(key: str, overrides: list[str]) -> str:
    """" (did you mean 'trainer.max_epochs'?)" for a key close to an existing one."""
    try:
        base = compose_unchecked([o for o in overrides if not o.lstrip("+~").startswith(key)])
    except UserError:
        return ""
    return key_hint(base, key, list_keys=False)


def _explain(err: Exception, overrides: list[str]) -> UserError:
    import yaml

    if isinstance(err, yaml.YAMLError):
        return yaml_error(err)
    text = str(err)
    m = re.search(r"Could not override '([^']+)'", text) or re.search(r"Key '([^']+)' is not in struct", text)
    if m:
        key = m.group(1)
        parent, _, leaf = key.rpartition(".")
        hint = ""
        value = next((o.split("=", 1)[1] for o in overrides if o.split("=", 1)[0].lstrip("+~") == key), "...")
        rest = [o for o in overrides if not o.lstrip("+~").startswith(key)]
        try:  # the config without the offending override, to suggest the closest existing key
            base = compose_unchecked(rest) if rest != overrides else None
            node = (OmegaConf.select(base, parent) if parent else base) if base is not None else None
            if isinstance(node, DictConfig) and leaf in node and isinstance(node[leaf], DictConfig):
                # the key exists: its value is a dict, which Hydra extends only key by key with '+'
                return UserError(f"cannot set '{key}' to {value}: it is a dict of the config, and keys it does "
                                 f"not have yet are added one by one with '+', e.g. +{key}.NAME=VALUE")
            if base is not None:
                hint = key_hint(base, key)
        except UserError:
            pass
        add = f"; to add a new key use +{key}={value}" if addable(key) else ""
        return UserError(f"unknown config key '{key}'{hint}{add}")
    first = text.strip().splitlines()[0] if text.strip() else type(err).__name__
    return UserError(f"invalid configuration: {first}")


def to_container(cfg: DictConfig) -> dict:
    return OmegaConf.to_container(cfg, resolve=True)
