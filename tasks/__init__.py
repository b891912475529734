"""Task families, one package each under tasks/ (uea, lra, tser, ...).

A task class registers itself once, with ``@register_task``, under the name its config file
``conf/task/<name>.yaml`` gives in ``name:``. Families are discovered: every subpackage of tasks/
is imported on the first lookup. A family package imports only light modules at import time
(numpy, torch): its heavy dependencies (torchvision, HF datasets, gymnasium...) are imported
inside the functions that use them, so they load only when that family runs.
"""
from __future__ import annotations

import importlib
import pkgutil

_TASKS: dict[str, type] = {}
_DISCOVERED = False


def register_task(cls: type) -> type:
    """Class decorator: register a Task subclass under ``cls.name``.

    Public API (stable, for plugins: bench_cli/config/plugins.py). A plugin's task is registered after
    the built-in families are discovered, so a name one of them holds is refused at once, with a
    ``NameTakenError`` naming both modules, whichever is looked up first."""
    from models.attention.registry import NameTakenError, is_builtin

    name = cls.name
    if not is_builtin(cls.__module__):
        discover()
    if name in _TASKS and _TASKS[name] is not cls:
        raise NameTakenError("task", name, _TASKS[name].__module__, cls.__module__)
    _TASKS[name] = cls
    return cls


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
    return sorted(_TASKS)


def task_class(name: str):
    from bench_cli.core.errors import unknown_choice

    discover()
    if name not in _TASKS:
        raise unknown_choice("task", name, available_tasks())
    return _TASKS[name]
