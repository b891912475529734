"""The jobs of a sweep composed as Hydra's launchers compose them, one Hydra composition per
distinct combination of config choices: ``JobComposer`` (the class docstring says why that is the
same config)."""
from __future__ import annotations

import copy
import os
from contextlib import contextmanager

from omegaconf import DictConfig, OmegaConf, open_dict

from bench_cli.config import hydra_private, omegaconf_private
from bench_cli.config.checks import (check_experiment_tasks, check_group_choices, chosen_experiments_and_tasks,
                                     parse_override)
from bench_cli.config.kept_config import KeptConfig
from bench_cli.config.session import HydraApp, composition_errors, explain, with_plugins
from bench_cli.core.errors import UserError


class JobComposer:
    """The jobs of a multirun as every Hydra launcher composes them (``HydraApp.compose_job``), with
    one Hydra composition per distinct combination of config choices instead of one per job.

    Hydra builds the defaults list from the overrides that name a config group and applies every
    other override to the composed config afterwards, in their order, with one function
    (hydra/_internal/config_loader_impl.py ``_load_configuration_impl``: ``config_overrides`` ->
    ``_apply_overrides_to_config``; hydra/_internal/defaults_list.py ``Overrides`` splits them by
    ``group_exists``). So a job is the composition of its group choices with its value overrides
    (seed, a learning rate, ``model.attention.beta``; additions and deletions of keys too) applied
    by that same function: the same config, a few milliseconds instead of a composition
    (tests/test_sweep.py compares every committed experiment with whole compositions). A job that
    overrides Hydra's own config (which can move the search path) is composed whole. Configs have
    no ``hydra`` node, as ``hydra.core.utils.run_job`` hands them to the job."""

    def __init__(self, app: HydraApp, master: DictConfig):
        self.app, self.master = app, master
        # the repository of the jobs' compositions (its search path has the config's hydra.searchpath)
        self._repo = hydra_private.job_repository(app.config_loader, master.hydra.job.config_name,
                                                  OmegaConf.to_container(master.hydra.overrides.hydra))
        self._parsed: dict[str, tuple[str, object]] = {}  # override line -> (its kind, Hydra's Override)
        self._bases: dict[tuple[str, ...], DictConfig] = {}  # config choices -> their composition
        # config choices -> a KeptConfig of their composition as composed, for the jobs' own copies
        # (unpickled: a deep copy of a composition was 16 ms, its unpickling 1.5 ms)
        self._kept: dict[tuple[str, ...], KeptConfig] = {}
        self._in_place: dict[tuple[str, ...], int] = {}  # config choices -> jobs whose values are set in it now
        self._unresolved: dict[tuple[str, ...], tuple | None] = {}  # config choices -> unresolved_template
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

    def _copy(self, choices: tuple[str, ...]) -> DictConfig:
        """A copy of the composition of ``choices``, the caller's own: unpickled from a pickle taken
        the first time one is asked for while no job's values are set in it (``applied``), else
        deep-copied as it is then."""
        if self._in_place.get(choices):
            return copy.deepcopy(self._base(choices))
        if choices not in self._kept:
            self._kept[choices] = KeptConfig(self._base(choices))
        return self._kept[choices].copy()

    def compose(self, overrides) -> DictConfig:
        """The job's config, its own object."""
        choices, values = self.split(overrides)
        return self._apply(self._copy(choices), values, overrides)

    @contextmanager
    def applied(self, overrides):
        """The job's config for the time of the ``with``, read-only, to keep nothing of: the shared
        composition of its choices with its values set in place and reset afterwards when each
        replaces a plain value by a plain value (no copy: most of a sweep), else ``compose``'s."""
        from omegaconf import flag_override

        choices, values = self.split(overrides)
        base = self._base(choices)
        replaced = omegaconf_private.replaced_values(base, values)
        if replaced is not None and choices not in self._unresolved:  # read before any value is set
            self._unresolved[choices] = omegaconf_private.unresolved_template(base)
        in_place = replaced is not None
        self._in_place[choices] = self._in_place.get(choices, 0) + in_place
        try:
            cfg = self._apply(base if in_place else self._copy(choices), values, overrides)
            with flag_override(cfg, "readonly", True):
                yield cfg
        finally:
            omegaconf_private.restore_values(replaced or [])
            self._in_place[choices] -= in_place

    def resolved(self, cfg: DictConfig, overrides) -> dict:
        """``OmegaConf.to_container(cfg, resolve=True)`` of a job's config from ``applied``, resolving
        only what can differ from the other jobs of its choices: its interpolations (an override
        they read, a resolver reading the root) and its values; the rest is the composition's,
        read once (a job's job_key in a fraction of a millisecond). The same data, or OmegaConf's
        error when something does not resolve."""
        choices, values = self.split(overrides)
        template = self._unresolved.get(choices)
        if template is None or self._bases.get(choices) is not cfg:  # not resolved in place: whole
            return OmegaConf.to_container(cfg, resolve=True)
        raw, interpolations = template
        out, copied = dict(raw), set()
        try:
            for path in [*interpolations, *(tuple(o.key_or_group.split(".")) for o in values)]:
                _set_copied(out, path, omegaconf_private.resolved_at(cfg, path), copied)
        except Exception:  # noqa: BLE001 - OmegaConf's own message, from resolving it whole
            return OmegaConf.to_container(cfg, resolve=True)
        return out

    @staticmethod
    def _apply(cfg: DictConfig, values: list, overrides) -> DictConfig:
        try:
            hydra_private.apply_value_overrides(values, cfg)
        except composition_errors() as e:
            raise explain(e, list(overrides)) from None
        return with_plugins(cfg)



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

