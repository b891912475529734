"""Task families, one package each under tasks/ (uea, lra, tser, ...).

A task class registers itself once, with ``@register_task``, under the name its config file
``conf/task/<name>.yaml`` gives in ``name:``. Families are discovered: every subpackage of tasks/
is imported on the first lookup. A family package imports only light modules at import time
(numpy, torch): its heavy dependencies (torchvision, HF datasets, gymnasium...) are imported
inside the functions that use them, so they load only when that family runs. The names are kept
by the project's one ``Registry`` (bench_cli/core/registry.py).
"""
from __future__ import annotations

if __name__ == "tasks":  # the old top-level name, imported before attnbench: one copy, under attnbench
    import attnbench.legacy_paths

    attnbench.legacy_paths.adopt(__name__)

import importlib
import pkgutil

from bench_cli.core.registry import Registry, is_builtin

# name -> Task subclass; its owner is the class's module.
TASKS: Registry[type] = Registry("task")
_DISCOVERED = False


def register_task(cls: type) -> type:
    """Class decorator: register a Task subclass under ``cls.name``.

    Public API (stable, for plugins: bench_cli/config/plugins.py). A plugin's task is registered after
    the built-in families are discovered, so a name one of them holds is refused at once, with a
    ``NameTakenError`` naming both modules, whichever is looked up first."""
    if not is_builtin(cls.__module__):
        discover()
    return TASKS.register(cls.name, cls, owner=cls.__module__)


def discover() -> None:
    """Import every family package under tasks/ (each registers its tasks and fetchers)."""
    global _DISCOVERED
    if _DISCOVERED:
        return
    _DISCOVERED = True
    for module in pkgutil.iter_modules(__path__):
        if module.ispkg:
            importlib.import_module(f"{__name__}.{module.name}")


def available_tasks() -> list[str]:
    discover()
    return TASKS.names()


def task_class(name: str):
    """The task class registered as ``name``; an unknown name is one line listing the valid ones."""
    discover()
    return TASKS.get(name)
