"""Composing a command's config, checked: the entry points every command calls (``compose``,
``compose_run``, ``compose_for_listing``), and bench_cli.config's composition API in one place.

Validation composes the config with Hydra's compose API first, so mistakes become one-line errors
with the valid choices. `run` and `sweep` compose through ``HydraApp`` (Hydra set up as
``@hydra.main`` sets it up), once per run and once per job, and run through Hydra's own job runner
and launchers. The parts, one concern each:

- search_path.py: where configs are looked up (conf/, --config-path, --config-dir, hydra.searchpath);
- index.py: conf/ read without Hydra (groups, options, the root config, experiments' tasks);
- keys.py: the keys a config has and may gain, and hints for a misspelt one;
- checks.py: the checks of overrides and their one-line errors;
- session.py: Hydra's compose session, the app `run` and `sweep` go through, composition errors;
- resolvers.py: the interpolation resolvers of conf/;
- job_composer.py: a sweep's jobs, one composition per combination of config choices;
- hydra_private.py, omegaconf_private.py: the only calls into Hydra's and OmegaConf's internals.

The names below the entry points are re-exported from those modules for the commands and
reports that use them (``from bench_cli.config import compose``)."""
from __future__ import annotations

from omegaconf import DictConfig, OmegaConf

from bench_cli.config.checks import (check_group_choices, check_value_types, parse_override, refuse_search,
                                     replaced_defaults)
from bench_cli.config.index import (experiment_tasks, group_options, load_option, option_data, option_file,
                                    root_config, root_default)
from bench_cli.config.job_composer import JobComposer
from bench_cli.config.keys import top_level_keys
from bench_cli.config.resolvers import cache_dir
from bench_cli.config.search_path import CONFIG_NAME, add_config_dir, conf_dir, config_dirs, set_config_path
from bench_cli.config.session import (HYDRA_VERSION_BASE, RUN_JOB_NAME, HydraApp, compose_unchecked, composer,
                                      dispatch_to_hydra, hydra_app, run_job, with_plugins)

__all__ = ["CONFIG_NAME", "HYDRA_VERSION_BASE", "HydraApp", "JobComposer", "add_config_dir", "cache_dir",
           "check_group_choices", "check_value_types", "compose", "compose_for_listing", "compose_run",
           "compose_unchecked", "composer", "conf_dir", "config_dirs", "dispatch_to_hydra", "experiment_tasks",
           "group_options", "hydra_app", "load_option", "option_data", "option_file", "parse_override",
           "refuse_search", "run_job", "set_config_path", "top_level_keys"]


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


def compose_run(overrides: list[str]) -> DictConfig:
    """The config of one `attnbench run`, with its hydra node, composed once: validation and the
    run use this same object (``run_job``)."""
    check_group_choices(overrides)
    from hydra.types import RunMode

    with hydra_app(RUN_JOB_NAME) as app, replaced_defaults(overrides) as defaults:
        cfg = app.compose(overrides, RunMode.RUN, with_log_configuration=True)
    check_value_types(cfg, overrides, defaults)
    return cfg


def compose_for_listing(overrides: list[str]) -> DictConfig:
    """The config `ls` reads (``paths``, ``plugins``). Without overrides it is read without Hydra:
    the root config's own keys and its ``paths`` option, as composing them gives (Hydra's
    composition costs most of a second, and `ls` answers at once). tests/test_cli.py
    checks it equals the composed one."""
    if overrides:
        return compose(overrides)
    keys = {k: v for k, v in root_config().items() if k not in ("defaults", "hydra")}
    cfg = OmegaConf.create({**keys, "paths": option_data("paths", root_default("paths"))})
    return with_plugins(cfg)

