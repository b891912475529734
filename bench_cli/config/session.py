"""Hydra's session over conf/: composing with the compose API (``composer``), the app `run` and
`sweep` compose and run through (``HydraApp``, set up as ``@hydra.main`` sets it up), Hydra's own
flags handed to a ``@hydra.main`` function, and composition errors as one line each.

Every composition searches the user's config folders (search_path.py: --config-dir, --config-path,
``hydra.searchpath``), has conf/'s resolvers (resolvers.py) and imports the plugins its
``plugins`` key names before it is returned. Where Hydra's public API cannot do the job, the calls
into Hydra's internals are hydra_private.py's."""
from __future__ import annotations

import re
from contextlib import contextmanager
from dataclasses import dataclass

from omegaconf import DictConfig, OmegaConf, open_dict

from bench_cli.config import hydra_private, resolvers  # noqa: F401 - resolvers: registered on import
from bench_cli.config.index import yaml_error
from bench_cli.config.keys import addable, key_hint
from bench_cli.config.search_path import (CONFIG_NAME, add_config_dir, conf_dir, config_path, primary_path,
                                          set_config_path, user_config_dirs)
from bench_cli.core.errors import UserError

HYDRA_VERSION_BASE = "1.3"
RUN_JOB_NAME = "attnbench"  # hydra.job.name of `attnbench run`: its log file is <run folder>/attnbench.log


@contextmanager
def composer():
    """A Hydra compose session over conf/ (and the --config-dir folders): yields
    ``compose_one(overrides, with_hydra=False)``, which turns composition errors into one-line
    UserErrors. Compositions inside one session share its initialisation (a sweep composes many
    jobs). The plugins a composed config names (``plugins:``) are imported before it is returned."""
    from hydra import compose as hydra_compose
    from hydra.core.global_hydra import GlobalHydra

    def compose_one(overrides: list[str], with_hydra: bool = False) -> DictConfig:
        try:
            cfg = hydra_compose(config_name=CONFIG_NAME, overrides=overrides, return_hydra_config=with_hydra)
        except composition_errors() as e:
            raise explain(e, overrides) from None
        return with_plugins(cfg)

    GlobalHydra.instance().clear()
    # as hydra.initialize_config_module(config_module="attnbench.conf", job_name="app") sets Hydra up,
    # plus --config-dir
    try:
        set_version_base()
        hydra_private.create_hydra("app", hydra_private.hydra_search_path("attnbench.conf.app", primary_path()))
        yield compose_one
    finally:
        GlobalHydra.instance().clear()


def compose_unchecked(overrides: list[str], with_hydra: bool = False) -> DictConfig:
    """Compose without the checks of ``compose`` (sweep grids, report lookups, error hints)."""
    with composer() as compose_one:
        return compose_one(overrides, with_hydra)


def composition_errors() -> tuple[type[Exception], ...]:
    """What a composition raises for a mistake in the configs: Hydra's errors, and YAML errors of a
    file (a user folder's yaml is read as it is found)."""
    import yaml
    from hydra.errors import HydraException

    return HydraException, yaml.YAMLError


def set_version_base() -> None:
    from hydra import version

    version.setbase(HYDRA_VERSION_BASE)  # as @hydra.main(version_base=...) does


def with_plugins(cfg: DictConfig) -> DictConfig:
    """``cfg`` after importing the plugins its ``plugins`` key names (before any validation)."""
    from bench_cli.config import plugins

    plugins.import_configured(cfg)
    return cfg


def dispatch_to_hydra(entry, args: list[str]) -> None:
    """Call a ``@hydra.main`` function as if from the command line (``sys.argv`` rewritten): for
    Hydra's own flags (--cfg, --info, --help), which print and run nothing. The --config-dir the
    CLI took (``add_config_dir``) is handed on (Hydra takes one)."""
    import sys

    given = {"--config-dir", "-cd"} & {a.split("=", 1)[0] for a in args}
    root, folders = config_path(), user_config_dirs()
    extra = ["--config-path", str(root), "--config-dir", str(conf_dir())] if root else []
    extra += ["--config-dir", str(folders[0])] if folders and not given and not root else []
    sys.argv = ["attnbench", *extra, *args]
    entry()


@dataclass
class HydraApp:
    """Hydra set up over conf/ as ``@hydra.main(config_path="pkg://attnbench.conf")`` sets it up for a
    function of module ``bench_cli.<job_name>`` (hydra/_internal/utils.py ``_run_hydra``), with
    Hydra's --config-path, --config-dir and --config-name flags: `run` and `sweep` compose and run
    through it instead of going through ``@hydra.main``, so that they compose each job once."""
    hydra: object  # Hydra's Hydra object (hydra_private.create_hydra)
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
            raise explain(e, overrides) from None
        return with_plugins(cfg)

    def compose_job(self, master: DictConfig, overrides: list[str]) -> DictConfig:
        """One job of a multirun, composed as every Hydra launcher composes it (``load_sweep_config``)."""
        try:
            cfg = self.config_loader.load_sweep_config(master, list(overrides))
        except composition_errors() as e:
            raise explain(e, overrides) from None
        return with_plugins(cfg)


@contextmanager
def hydra_app(job_name: str, flags: dict | None = None):
    """A ``HydraApp`` for the time of the ``with`` (Hydra's global state set, then cleared);
    ``flags`` are Hydra's flags as ``bench_cli.config.args.Parsed.hydra`` holds them."""
    from hydra.core.global_hydra import GlobalHydra

    set_version_base()
    flags = flags or {}
    if flags.get("--config-path") or flags.get("-cp"):
        set_config_path(str(flags.get("--config-path") or flags.get("-cp")))
    config_dir = flags.get("--config-dir") or flags.get("-cd")
    folder = add_config_dir(str(config_dir)) if config_dir else None
    search_path = hydra_private.hydra_search_path(f"bench_cli.{job_name}", primary_path(), folder)
    GlobalHydra.instance().clear()  # a composition of the checks may have left one
    try:
        hydra = hydra_private.create_hydra(job_name, search_path)
        yield HydraApp(hydra, str(flags.get("--config-name") or flags.get("-cn") or CONFIG_NAME))
    finally:
        GlobalHydra.instance().clear()



def run_job(cfg: DictConfig, task_function) -> object:
    """Run ``task_function(cfg)`` with the config ``compose_run`` made, as Hydra's run mode does
    (hydra/_internal/hydra.py ``Hydra.run``: callbacks, output folder from ``hydra.run.dir``,
    HydraConfig, job logging).

    Not ``Hydra.run`` itself: it composes the config from the overrides, so `attnbench run` would
    compose twice (once to check the config before anything is created, once to run) or check it
    only inside the job, after Hydra has made the run folder, so a mistake would leave a folder
    behind and the run id of a distributed run (decided from the composed config, and part of
    ``hydra.run.dir``) could not be set first. Only the composition differs from ``Hydra.run``."""
    from hydra.core.utils import run_job as hydra_run_job
    from hydra.types import HydraContext, RunMode

    with hydra_app(RUN_JOB_NAME) as app:
        with open_dict(cfg.hydra):
            cfg.hydra.mode = RunMode.RUN
        callbacks = hydra_private.callbacks(cfg)
        callbacks.on_run_start(config=cfg, config_name=app.config_name)
        ret = hydra_run_job(hydra_context=HydraContext(config_loader=app.config_loader, callbacks=callbacks),
                            task_function=task_function, config=cfg, job_dir_key="hydra.run.dir",
                            job_subdir_key=None, configure_logging=True)
        callbacks.on_run_end(config=cfg, config_name=app.config_name, job_return=ret)
        return ret.return_value  # re-raises the task's exception


def explain(err: Exception, overrides: list[str]) -> UserError:
    """A composition error as one line: an unknown key with the close ones (or how to add it), a
    YAML error with its file and line, else Hydra's first line (and the reason on the next, when
    the first ends with a colon)."""
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
    lines = text.strip().splitlines() or [type(err).__name__]
    # Hydra's "In 'file': ConfigTypeError raised while composing config:" says what failed where;
    # OmegaConf's next line says why (the cannot-merge of a list into a table)
    first = f"{lines[0]} {lines[1].strip()}" if lines[0].endswith(":") and len(lines) > 1 else lines[0]
    return UserError(f"invalid configuration: {first}")
