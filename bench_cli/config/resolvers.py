"""The interpolation resolvers conf/ uses, registered with OmegaConf when this module is imported
(session.py imports it, so every composition has them): ``${attnbench_cache:SUB}`` and
``${per_dataset:OPTION,DEFAULT}``."""
from __future__ import annotations

import os
from pathlib import Path

from omegaconf import OmegaConf


def cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "attnbench"


def per_dataset(option: str, default=None, *, _root_):
    """``${per_dataset:OPTION,DEFAULT}``: a hyperparameter the papers tabulate per (model, dataset),
    e.g. beta of Attention-BN (papers/003, Tables 12-14). Experiment configs hold the tables as
    ``per_dataset.<OPTION>.<model.name>.<task.dataset>``; presets interpolate the value only into
    the variants that take the option, so other variants never see it. DEFAULT when absent."""
    table = OmegaConf.select(_root_, f"per_dataset.{option}", default=None)
    model = OmegaConf.select(_root_, "model.name", default=None)
    dataset = OmegaConf.select(_root_, "task.dataset", default=None)
    if table is None or model not in table or table[model] is None or dataset not in table[model]:
        return default
    return table[model][dataset]


def register_resolvers() -> None:
    if not OmegaConf.has_resolver("attnbench_cache"):
        OmegaConf.register_new_resolver("attnbench_cache", lambda sub="": str(cache_dir() / sub))
    if not OmegaConf.has_resolver("per_dataset"):
        OmegaConf.register_new_resolver("per_dataset", per_dataset)


register_resolvers()
