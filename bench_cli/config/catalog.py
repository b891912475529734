"""The built-in attentions and tasks as data, readable without importing torch, so that `attnbench
ls` answers at once: the registries live in torch modules (``register_attention`` on
``nn.Module`` classes, ``register_task`` on task classes), and importing them costs seconds.

``bench_cli/config/catalog_table.py`` holds what the live registries say about the built-ins; it is
written from them by ``python -m bench_cli.config.catalog`` and tests/test_cli_speed.py checks that it
still equals them, so the two cannot drift. A process that has imported the registries already
(a plugin registers through them, so it imports them) reads them live: plugins' names are in no
table.
"""
from __future__ import annotations

import pprint
import sys
from dataclasses import asdict
from pathlib import Path

from bench_cli.core.files import write_atomically

TABLE = Path(__file__).with_name("catalog_table.py")


def _live() -> bool:
    from bench_cli.config import plugins

    return bool(plugins.loaded()) or "attnbench.models.attention" in sys.modules


def attentions() -> dict[str, dict]:
    """name -> {paper, equation, owner, capabilities: {causal: bool, ...}} of every attention."""
    return live_attentions() if _live() else table_attentions()


def table_attentions() -> dict[str, dict]:
    """The table's attentions, their capabilities completed with the defaults (the table holds
    only those that differ)."""
    from bench_cli.config.catalog_table import ATTENTIONS, CAPABILITY_DEFAULTS

    return {name: {**a, "capabilities": {**CAPABILITY_DEFAULTS, **a["capabilities"]}} for name, a in ATTENTIONS.items()}


def tasks() -> dict[str, dict]:
    """name -> {selection, higher_is_better, fetcher, datasets} of every task (``datasets``: the
    names it knows without looking at a data root)."""
    if _live():
        return live_tasks()
    from bench_cli.config.catalog_table import TASKS

    return TASKS


def live_attentions(builtin_only: bool = False) -> dict[str, dict]:
    from attnbench.models.attention import attention_spec, available_attentions

    specs = [attention_spec(n) for n in available_attentions()]
    return {s.name: {"paper": s.paper, "equation": s.equation, "owner": s.owner,
                     "capabilities": asdict(s.capabilities)}
            for s in specs if s.builtin or not builtin_only}


def live_tasks(builtin_only: bool = False) -> dict[str, dict]:
    from bench_cli.core.registry import is_builtin
    from attnbench.tasks import available_tasks, task_class

    rows = {}
    for name in available_tasks():
        cls = task_class(name)
        if builtin_only and not is_builtin(cls.__module__):
            continue
        selection = next(m for m in cls.metrics if m.name == cls.selection)
        rows[name] = {"selection": selection.name, "higher_is_better": bool(selection.higher_is_better),
                      "fetcher": cls.fetcher or None, "datasets": list(cls.datasets(None))}
    return rows


def table_source() -> str:
    """The text of catalog_table.py for the live registries' built-ins."""
    from attnbench.models.attention import Capabilities

    def literal(value: dict) -> str:
        return pprint.pformat(value, width=110, sort_dicts=True)

    defaults = asdict(Capabilities())
    attentions = {name: {**a, "capabilities": {k: v for k, v in a["capabilities"].items() if v != defaults[k]}}
                  for name, a in live_attentions(builtin_only=True).items()}
    return (f'"""Written by `python -m bench_cli.config.catalog` from the live registries: do not edit (see\n'
            f'bench_cli/config/catalog.py)."""\n\nCAPABILITY_DEFAULTS = {literal(defaults)}\n\n'
            f"ATTENTIONS = {literal(attentions)}\n\nTASKS = {literal(live_tasks(builtin_only=True))}\n")


if __name__ == "__main__":
    write_atomically(TABLE, table_source())
    print(f"wrote {TABLE}")
