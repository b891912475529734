"""What makes two runs the same: the config hash, the job key and the variant key of a config.

The job key names a job across sweeps, reruns and versions (a sweep's resume, a job's claim and
its checkpoint folder, a report counting each job once): only the parts of the config that change
a result go into it, and keys or values added or renamed later keep the keys of earlier records.
"""
from __future__ import annotations

import copy
import hashlib
import json

from omegaconf import DictConfig, OmegaConf

# Config parts that do not change a result: where things are written and how progress is shown.
NON_SEMANTIC = ("paths", "results", "logger", "hydra", "report", "tuning")
# Dotted keys inside the semantic groups that never change a result either: how a run shows
# progress, its evaluation batch and threads, and task.generator (which generated ListOps the run
# expects: a check of the data, refused when they differ; the record describes the data it read).
NON_SEMANTIC_KEYS = ("trainer.progress", "trainer.eval_batch_size", "trainer.num_threads", "task.generator",
                     "trainer.checkpoint", "trainer.resume")  # where and how often a fit is saved: same result


# Keys added to the config after records were first written, with the value that reproduces the
# earlier behaviour: at that value they are left out of the keys below, so a config that does not
# use them keeps its job key and its earlier records still count as done. Append, never edit.
ADDED_KEYS: dict[str, object] = {
    "trainer.num_workers": 0,
    # the Primal-Attention options of the authors' code (models/attention/primal.py) ...
    **{f"model.{role}.{option}": neutral for role in ("attention", "final_attention")
       for option, neutral in (("ksvd_form", "paper"), ("ksvd_square", "per_sample_head"), ("rows", "full"),
                               ("init", "per_head"), ("padding", "valid"), ("row_positions", "floor"))},
    "model.ksvd_layers": "sum",
    # ... and the UEA backbone options of their time-series code (models/timeseries.py)
    "task.backbone.attention_dropout": None,
    "task.backbone.final_norm": False,
    "task.backbone.attention_mask": True,
    "trainer.scheduler.warmup_init_lr": 0.0,
    "measure.inference_samples": None,
    "measure.head_diversity": False,
    "measure.cache": True,
    "trainer.optimizer.lr_reference_batch": None,
    "trainer.optimizer.no_decay_1d": False,
    "trainer.scheduler.warmup_epochs": None,
    "trainer.scheduler.warmup_lr": None,
    "trainer.scheduler.min_lr": 0.0,
    "trainer.drop_last": False,
    "trainer.train_metrics": False,
    "trainer.strategy": "none",
    "trainer.precision": "32",
    "plugins": [],  # the modules named change the run (another attention); none is the old config
}


# Values renamed after records were written, with the value the earlier records hashed, so a
# config that means the same keeps its job key. Append, never edit.
RENAMED_VALUES: dict[str, dict] = {
    "trainer.train_metrics": {"none": False, "batches": True},  # was a switch (false / true)
}


def _holder(tree: dict, dotted: str) -> tuple[dict | None, str]:
    """(the dict that holds ``dotted``'s last key, that key); None when a parent is missing."""
    *parents, leaf = dotted.split(".")
    node = tree
    for p in parents:
        node = node.get(p) if isinstance(node, dict) else None
    return (node if isinstance(node, dict) else None), leaf


def semantic_config(cfg: DictConfig | dict) -> dict:
    """The parts of a config that change a result. ``cfg``: a DictConfig, or the plain data
    ``OmegaConf.to_container(cfg, resolve=True)`` gave (copied, not changed: the same keys)."""
    c = OmegaConf.to_container(cfg, resolve=True) if isinstance(cfg, DictConfig) else copy.deepcopy(cfg)
    for dotted, renamed in RENAMED_VALUES.items():
        node, leaf = _holder(c, dotted)
        if node is not None and isinstance(node.get(leaf), str) and node[leaf] in renamed:
            node[leaf] = renamed[node[leaf]]
    for k in NON_SEMANTIC:
        c.pop(k, None)
    for dotted in NON_SEMANTIC_KEYS:
        node, leaf = _holder(c, dotted)
        if node is not None:
            node.pop(leaf, None)
    for dotted, neutral in ADDED_KEYS.items():
        node, leaf = _holder(c, dotted)
        if node is not None and leaf in node and node[leaf] == neutral:
            del node[leaf]
    return c


def _digest(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]


def run_keys(cfg) -> tuple[str, str, str]:
    """(config hash, job key, variant key) of a config from one ``semantic_config`` (resolving a
    config is most of the cost: a run resolves it once).

    - config hash: the resolved config that determines the result (seed included);
    - job key: a sweep job's key for resume, the semantic config (with seed) minus measurement switches;
    - variant key: the job key without the seed (the runs a report aggregates over seeds share it)."""
    c = semantic_config(cfg)
    config = _digest(c)
    job = _digest(_without_measurement(c))
    c.pop("seed", None)
    return config, job, _digest(c)


def _without_measurement(semantic: dict) -> dict:
    semantic.pop("measure", None)
    return semantic


def config_hash(cfg) -> str:
    return _digest(semantic_config(cfg))


def job_key(cfg) -> str:
    return _digest(_without_measurement(semantic_config(cfg)))


def variant_key(cfg) -> str:
    return run_keys(cfg)[2]
