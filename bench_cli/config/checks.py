"""Checks of the user's overrides before anything runs, each refusal one line with what to type:
Hydra's grammar, unknown options of a config group, keys nothing reads, a sweep outside `sweep`,
an experiment given a task it is not for, and values of the wrong type.

``quick_check`` judges the commonest mistakes without importing Hydra; the rest parse the
overrides with Hydra's grammar and, for hints and default values, compose (session.py)."""
from __future__ import annotations

import functools
import re
from contextlib import contextmanager

from omegaconf import DictConfig, OmegaConf

from bench_cli.config import hydra_private
from bench_cli.config.index import GROUPS, experiment_tasks, group_options
from bench_cli.config.keys import ADDABLE, addable, key_hint, top_level_keys
from bench_cli.config.search_path import config_dirs, note_searchpath
from bench_cli.config.session import compose_unchecked
from bench_cli.core.errors import UserError, unknown_choice


def parse_overrides(overrides: list[str]) -> list:
    return [parse_override(o) for o in overrides]


@functools.cache
def _override_parser():
    from hydra.core.override_parser.overrides_parser import OverridesParser

    return OverridesParser.create()


@functools.lru_cache(maxsize=65536)
def parse_override(override: str):
    """One override parsed by Hydra's grammar (as Hydra parses a job's overrides), once per distinct
    line: a sweep's jobs repeat theirs, and parsing them was much of a large sweep's planning. The
    result is only read."""
    from hydra.errors import OverrideParseException

    try:
        (parsed,) = _override_parser().parse_overrides([override])
    except OverrideParseException as e:
        raise _unparsable(override, e) from None
    return parsed


def _unparsable(override: str, err: Exception) -> UserError:
    """The error of an override Hydra's grammar refuses. A value with characters its unquoted
    values cannot hold (non-ASCII letters, spaces) works quoted: say so, and show
    the quoted form to type."""
    import shlex

    key, eq, value = override.partition("=")
    if eq and value and value[0] not in "'\"" and re.search(r"[^\x21-\x7e]", value):
        quoted = shlex.quote(f'{key}="{value}"' if '"' not in value else f"{key}='{value}'")
        return UserError(f"bad override '{override}': a value with spaces or non-ASCII characters needs "
                         f"quotes in Hydra's override grammar; type it as {quoted}")
    first = str(err).strip().splitlines()[0]
    return UserError(f"bad override '{override}': {first} (expected key=value, +key=value or group=option)")


# A plain `key=value` (no sweep, quotes or function): what quick_check can judge without Hydra.
_PLAIN_OVERRIDE = re.compile(r"([A-Za-z_][\w.]*)=([\w./-]+)", re.ASCII)


def quick_check(overrides: list[str]) -> None:
    """The commonest mistakes of plain ``key=value`` overrides, found without importing Hydra (that
    alone takes half a second, and a misspelt override answers at once): an unknown
    option of a group (``task=uae``) and a top-level key that no config has (``modle=softmax``).
    Same messages as the full checks (``check_group_choices``, ``session.explain``), which judge the rest."""
    for o in overrides:
        m = _PLAIN_OVERRIDE.fullmatch(o)
        if not m or m.group(2) == "null":
            continue
        key, value = m.groups()
        if key in GROUPS and value not in group_options(key):
            raise unknown_choice(key, value, group_options(key))
        if key.split(".")[0] not in top_level_keys():  # no config has it: Hydra would refuse it too
            raise UserError(f"unknown config key '{key}'{key_hint({}, key)}")  # nothing composed: the top level




def check_experiment_tasks(experiments: list[str], tasks: list[str]) -> None:
    """A ``task=`` an experiment is not for is one line saying so, before any other suggestion
    (the experiment's settings would fail later on the other task's model)."""
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
    composition of the group choices alone (a quarter of a second per run). Yields
    key -> default as plain data; a key whose default could not be read is left out (composed then)."""
    from omegaconf.errors import OmegaConfBaseException

    keys = [o.key_or_group for o in _value_overrides(parse_overrides(overrides))]
    defaults: dict = {}
    if not keys:
        yield defaults
        return

    def record(cfg) -> None:
        defaults.clear()  # the last composition's (an error's hint composes others)
        for key in keys:
            try:
                defaults[key] = _plain(OmegaConf.select(cfg, key, throw_on_missing=False))
            except OmegaConfBaseException:
                pass

    with hydra_private.overrides_applied_after(record):  # another Hydra: nothing recorded, check_value_types composes
        yield defaults


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


def _existing_hint(key: str, overrides: list[str]) -> str:
    """" (did you mean 'trainer.max_epochs'?)" for a key close to an existing one."""
    try:
        base = compose_unchecked([o for o in overrides if not o.lstrip("+~").startswith(key)])
    except UserError:
        return ""
    return key_hint(base, key, list_keys=False)


