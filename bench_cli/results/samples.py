"""Per-sample test outputs beside a record: ``samples.npz`` in the run folder.

A record's metric is a mean over the test samples; comparing two models by their means over seeds
(Welch) ignores that both saw the same samples. Keeping each sample's prediction, target and loss
of the reported test evaluation (bench_cli.core.task.Task.sample_outputs) lets a report pair them
(bench_cli/results/report/paired.py: a paired bootstrap of the difference, McNemar's test), as
lm-evaluation-harness's ``--log_samples`` does. Compressed numpy arrays, a few bytes a sample;
``results.samples: false`` turns it off (a huge test set). The record's ``test_samples`` column
says how many samples the file holds (empty: none kept: turned off, a task whose outputs are not
per sample, a distributed run, or a paper-protocol fit resumed after its selected evaluation).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

FILE = "samples.npz"
COLUMN = "test_samples"  # the record column (bench_cli/results/schema.py declares it)


def enabled(cfg) -> bool:
    """``results.samples`` (true unless turned off)."""
    from omegaconf import OmegaConf

    return bool(OmegaConf.select(cfg, "results.samples", default=True))


def save(run_dir: Path, batches: list | None) -> dict:
    """Write the per-sample outputs ``batches`` (one {name: tensor} per evaluation batch) to the
    run folder; the record's column: {test_samples: how many} ({} when there are none)."""
    if not batches:
        return {}
    import torch

    arrays = {name: torch.cat([b[name].reshape(len(b[name]), -1).squeeze(-1) for b in batches]).cpu().numpy()
              for name in batches[0]}
    path = Path(run_dir) / FILE
    tmp = path.with_name(f".{FILE}.tmp.npz")
    np.savez_compressed(tmp, **arrays)
    tmp.replace(path)
    return {COLUMN: int(len(next(iter(arrays.values()))))}


def load(row: dict) -> dict[str, np.ndarray] | None:
    """The per-sample outputs of a record ({name: array}), None when it kept none or its run folder
    is gone (a records file copied without its runs)."""
    if not row.get(COLUMN) or not row.get("output_dir"):
        return None
    path = Path(row["output_dir"]) / FILE
    if not path.is_file():
        return None
    with np.load(path) as data:
        return {name: data[name] for name in data.files}
