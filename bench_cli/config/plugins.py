"""Plugins: modules outside attnbench that register attentions (and tasks) through the public API.

The public API, kept stable for plugins: ``models.attention.register_attention``, ``Capabilities``,
``ProjectedAttention`` (a ``kernel(q, k, v, mask, causal)`` on (batch, heads, length, d_head)
tensors) and ``tasks.register_task``. A plugin is found three ways (docs/models.md "Bring your own
attention"), like lm-evaluation-harness's ``--include_path`` but for code:

- ``ATTNBENCH_PLUGINS=mod1,mod2``: module names, importable from ``sys.path`` (PYTHONPATH);
- ``plugins: [mod1, ...]`` in a config (conf/config.yaml, an experiment, ``plugins=[mod]``);
- the ``attnbench.plugins`` entry-point group of installed packages: ``name = "module"`` (or
  ``"module:function"``, a function called once to register).

Each module is imported once per process: the first two (and entry points) by the CLI before it
composes (``import_plugins``), the config key right after composition, before validation
(``import_configured``). Every process of a sweep does the same (its job function), and the
sweep passes the modules on in ``ATTNBENCH_PLUGINS``. A plugin that fails to import, or registers
a name already taken, is one ``UserError`` line naming the module. Records name every plugin of
the process and its version (``describe``), so a result from a plugin is traceable.
"""
from __future__ import annotations

import importlib
import os
from dataclasses import dataclass
from functools import lru_cache

from bench_cli.core.errors import UserError, first_line
from bench_cli.core.registry import NameTakenError

PLUGINS_ENV = "ATTNBENCH_PLUGINS"
ENTRY_POINT_GROUP = "attnbench.plugins"


@dataclass(frozen=True)
class Plugin:
    module: str
    found_by: str  # "ATTNBENCH_PLUGINS", "config key plugins", "entry point NAME"
    distribution: str | None = None  # the installed package the module belongs to
    version: str | None = None

    def describe(self) -> str:
        """'mymod==1.2 (module mymod)', or the module's file when no package holds it."""
        if self.distribution:
            return f"{self.distribution}=={self.version} (module {self.module})"
        import sys

        where = getattr(sys.modules.get(self.module), "__file__", None)
        return f"{self.module} (no package{': ' + where if where else ''})"


_LOADED: dict[str, Plugin] = {}  # module -> plugin, in import order
_ENTRY_POINTS_DONE = False


class PluginError(UserError):
    """A plugin that cannot be imported, or that registers a name already taken."""


def loaded() -> list[Plugin]:
    return list(_LOADED.values())


def names_in(value) -> list[str]:
    """Module names from ``mod1,mod2`` or a list (empty entries dropped)."""
    items = value.split(",") if isinstance(value, str) else list(value or [])
    return [str(m).strip() for m in items if str(m).strip()]


def import_plugin(module: str, found_by: str, distribution: str | None = None, version: str | None = None,
                  attr: str | None = None) -> Plugin:
    """Import ``module`` (once per process); ``attr``: a function of it to call (entry points)."""
    if module in _LOADED:
        return _LOADED[module]
    try:
        obj = importlib.import_module(module)
        if attr:
            for part in attr.split("."):
                obj = getattr(obj, part)
            obj()
    except NameTakenError as e:
        raise PluginError(f"plugin {module} ({found_by}): {e}") from None
    except (Exception, SystemExit) as e:  # noqa: BLE001 - any error of user code (even sys.exit) is one line
        hint = ""
        if isinstance(e, ModuleNotFoundError) and e.name == module.split(".")[0]:
            hint = " (put its folder on PYTHONPATH or install its package)"
        first = first_line(e)
        if isinstance(e, SystemExit):
            first = f"exit status {e.code or 0}" if isinstance(e.code, int) or e.code is None else first
        raise PluginError(f"plugin {module} ({found_by}) failed to import: {type(e).__name__}: {first}{hint}") from None
    if distribution is None:
        distribution = _distribution_of(module)
    if distribution and version is None:
        version = _version(distribution)
    plugin = _LOADED[module] = Plugin(module, found_by, distribution, version)
    return plugin


def import_plugins() -> list[Plugin]:
    """The plugins of ``ATTNBENCH_PLUGINS`` and of the ``attnbench.plugins`` entry points."""
    global _ENTRY_POINTS_DONE
    for module in names_in(os.environ.get(PLUGINS_ENV, "")):
        import_plugin(module, PLUGINS_ENV)
    if not _ENTRY_POINTS_DONE:
        _ENTRY_POINTS_DONE = True
        from importlib.metadata import entry_points

        for ep in entry_points(group=ENTRY_POINT_GROUP):
            dist = getattr(ep, "dist", None)
            import_plugin(ep.module, f"entry point {ep.name}", dist.name if dist else None,
                          dist.version if dist else None, attr=ep.attr)
    return loaded()


def import_configured(cfg) -> list[Plugin]:
    """The plugins the config's ``plugins`` key names (after composition, before validation)."""
    from omegaconf import OmegaConf

    value = OmegaConf.select(cfg, "plugins", default=None) if OmegaConf.is_config(cfg) else cfg.get("plugins")
    if value is not None and not isinstance(value, str) and not OmegaConf.is_list(value) \
            and not isinstance(value, (list, tuple)):
        raise UserError(f"plugins: expected a list of module names, got {value!r}")
    for module in names_in(value):
        import_plugin(module, "config key plugins")
    return loaded()


def export_to_environment() -> None:
    """Name every imported plugin in ``ATTNBENCH_PLUGINS`` so processes started from here (a
    sweep's local workers, Slurm jobs that inherit the environment) import the same ones."""
    names = names_in(os.environ.get(PLUGINS_ENV, ""))
    names += [p.module for p in loaded() if p.module not in names and not p.found_by.startswith("entry point")]
    if names:
        os.environ[PLUGINS_ENV] = ",".join(names)


def describe() -> str:
    """The record's ``plugins`` cell: 'mymod==1.2 (module mymod); other (no package: /path/other.py)'."""
    return "; ".join(p.describe() for p in loaded())


@lru_cache(maxsize=1)
def _packages() -> dict[str, list[str]]:
    from importlib.metadata import packages_distributions

    return packages_distributions()


def _distribution_of(module: str) -> str | None:
    dists = _packages().get(module.split(".")[0])
    return dists[0] if dists else None


def _version(distribution: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(distribution)
    except PackageNotFoundError:
        return None
