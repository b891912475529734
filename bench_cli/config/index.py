"""The conf/ tree read without Hydra: its groups and their options, an option's YAML (with the
options it extends), the root config and its defaults, and the tasks each experiment is for.

These reads answer listings and the quick checks at once (importing Hydra alone takes half a
second); each says in its docstring which of Hydra's rules it follows. The folders searched are
search_path.py's."""
from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from bench_cli.config.search_path import CONFIG_NAME, conf_dir, config_dirs, root_dir
from bench_cli.core.errors import UserError

GROUPS = ("task", "model", "trainer", "logger", "paths", "experiment")


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
    once). YAML's own typing (no interpolation; '1e-3' stays a string): for names."""
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



def yaml_loader():
    import yaml

    return getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml when built with it: ten times faster


def read_yaml(path: Path) -> dict:
    """A YAML file as plain data (YAML's own typing: no interpolation, '1e-3' stays a string), read
    without OmegaConf for the checks and listings that answer at once. A YAML error is
    one line naming the file and its line."""
    import yaml

    try:
        with path.open() as f:
            return yaml.load(f, Loader=yaml_loader()) or {}
    except yaml.YAMLError as e:
        raise yaml_error(e) from None


def root_config() -> dict:
    """conf/config.yaml as plain data (``read_yaml``)."""
    return read_yaml(root_dir() / f"{CONFIG_NAME}.yaml")


def root_default(group: str) -> str:
    """The option of ``group`` the root config's defaults list selects."""
    return next(d[group] for d in root_config()["defaults"] if isinstance(d, dict) and group in d)


def experiment_tasks(name: str) -> list[str]:
    """The tasks experiment ``name`` is for, read from its YAML and its parents'
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


