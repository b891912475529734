"""The contract between a task and the trainer (see ../shared/DESIGN.md).

A task owns its data (official format, from the data root), its head and its metric. The
trainer only sees batches (dicts of tensors), ``model_inputs(batch)``, ``loss`` and summable
``batch_stats`` that ``metrics`` turns into numbers.
"""
from __future__ import annotations

from pathlib import Path
from typing import ClassVar

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import Dataset


class TensorDictDataset(Dataset):
    """Samples are dicts of equally long tensors, indexed along the first axis."""

    def __init__(self, **tensors: torch.Tensor):
        lengths = {len(t) for t in tensors.values()}
        if len(lengths) != 1:
            raise ValueError(f"tensors of unequal length: {lengths}")
        self.tensors = tensors

    def __len__(self) -> int:
        return len(next(iter(self.tensors.values())))

    def __getitem__(self, i):
        return {k: t[i] for k, t in self.tensors.items()}


class Task:
    """Base class; subclasses set ``name`` and implement the data and model hooks."""

    name: ClassVar[str]
    metric: ClassVar[str] = "accuracy"  # selection metric, higher is better
    # Capabilities an attention variant must have for this task (models.attention.Capabilities fields).
    requires: ClassVar[dict[str, bool]] = {}

    def __init__(self, cfg, data_root: str | Path):
        self.cfg = cfg
        self.data_root = Path(data_root).expanduser()
        self.splits: dict[str, Dataset] = {}

    # --- data -------------------------------------------------------------------------------
    @classmethod
    def datasets(cls, data_root: Path | None = None) -> list[str]:
        """Dataset names this task family knows (plus, where supported, user sets under data_root)."""
        raise NotImplementedError

    @classmethod
    def dataset_status(cls, dataset: str, data_root: Path) -> str:
        """'local' (under the data root), 'package' (shipped in an installed package) or 'missing'."""
        raise NotImplementedError

    @classmethod
    def fetch(cls, dataset: str, data_root: Path, force: bool = False) -> Path:
        """Put ``dataset`` under the data root (copy from a package or download); return its folder."""
        raise NotImplementedError

    def check_data(self) -> None:
        """Raise bench_cli.errors.DataNotFoundError (one line: where to put it, how to fetch) if absent."""
        raise NotImplementedError

    def setup(self, protocol: str) -> None:
        """Load and preprocess; fill ``self.splits`` with 'train', 'test' and (holdout) 'val'."""
        raise NotImplementedError

    @property
    def dataset_name(self) -> str:
        return str(self.cfg.get("dataset", self.name))

    # --- shapes without data (profiling) -----------------------------------------------------
    def setup_synthetic(self, seq_len: int) -> None:
        """Fix the data-dependent shapes (channels, classes, vocabulary) for sequences of
        ``seq_len`` without reading any data, so ``build_model`` works for profiling."""
        raise NotImplementedError

    def synthetic_batch(self, batch_size: int, seq_len: int, device="cpu") -> dict:
        """Random inputs and targets of the task's shapes and dtypes (after ``setup_synthetic``),
        usable with ``model_inputs`` and ``loss``; all positions are real (mask all True)."""
        raise NotImplementedError

    # --- model ------------------------------------------------------------------------------
    def build_model(self, model_cfg) -> nn.Module:
        raise NotImplementedError

    def model_inputs(self, batch: dict) -> dict:
        """Keyword arguments of the model's forward for a batch."""
        raise NotImplementedError

    # --- loss and metric (classification by default) ----------------------------------------
    def loss(self, output: torch.Tensor, batch: dict) -> torch.Tensor:
        return F.cross_entropy(output, batch["y"])

    def batch_stats(self, output: torch.Tensor, batch: dict) -> dict[str, float]:
        y = batch["y"]
        return {
            "n": float(len(y)),
            "correct": float((output.argmax(-1) == y).sum()),
            "loss_sum": float(F.cross_entropy(output, y, reduction="sum")),
        }

    def metrics(self, stats: dict[str, float]) -> dict[str, float]:
        n = max(stats.get("n", 0.0), 1.0)
        return {"accuracy": 100.0 * stats["correct"] / n, "loss": stats["loss_sum"] / n}

    def describe(self) -> dict:
        """Facts about the loaded data for the summary and the record (shapes, classes...)."""
        return {}
