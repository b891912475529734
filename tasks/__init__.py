"""Task families: each is data in its official format + a metric + a head.

Tasks are imported lazily by name so one family's heavy dependencies (torchvision, HF
datasets, gymnasium) are only imported when that family is used.
"""
from __future__ import annotations

import importlib

# task config name -> "module:Class"
TASKS: dict[str, str] = {
    "uea": "tasks.uea:UEAClassification",
    # Long Range Arena (tasks/lra.py); "lra" only fetches the release (`attnbench data lra`).
    "lra": "tasks.lra:LRARelease",
    "lra_listops": "tasks.lra:LRAListOps",
    "lra_text": "tasks.lra:LRAText",
    "lra_retrieval": "tasks.lra:LRARetrieval",
    "lra_image": "tasks.lra:LRAImage",
    "lra_pathfinder": "tasks.lra:LRAPathfinder",
}


def available_tasks() -> list[str]:
    return sorted(TASKS)


def task_class(name: str):
    from bench_cli.errors import unknown_choice

    if name not in TASKS:
        raise unknown_choice("task", name, available_tasks())
    module, cls = TASKS[name].split(":")
    return getattr(importlib.import_module(module), cls)
