"""The contract between a task and the rest of attnbench (see ../shared/DESIGN.md).

A task owns its data (official format, from the data root), its head and loss, its metrics and
how it is evaluated. The trainer sees only what is declared here:

* data: ``fetcher`` names the dataset source (tasks.fetch) that serves the task and alone answers
  whether a dataset is present (``check_data`` asks it; ``DATASETS`` restricts the names the task
  reads); ``protocols`` are the protocols the task supports, checked once, in ``setup(protocol)``,
  which then calls the task's ``make_splits(protocol)`` to fill ``splits`` ('train', 'test', and
  'val' for holdout, e.g. with tasks.data.validation_split) with datasets of dict samples, and
  refuses in one line a training or evaluated split (``evaluated_splits``) without a sample;
  ``transform(split)`` (per-sample augmentation, applied in the DataLoader workers),
  ``collate(split)`` (batching, e.g. padding variable-length sequences) and
  ``sampler(split, dataset, generator)`` shape the loaders;
* model: ``build_model(model_cfg)``, ``model_inputs(batch)``, ``loss(output, batch)``;
  ``attention_stacks()`` names the attention roles the model has (encoder self-attention,
  causal decoder self-attention, cross-attention) and their depth, ``requires`` what every
  attention must support; both are checked against the registry's capabilities before building;
* metrics: ``metrics`` (bench_cli.metrics: name, direction, summable statistics) and
  ``selection``, the metric that selects the model (on 'val' under holdout, on 'test' under
  the flagged ``paper`` protocol); ``resolve_protocol(name)`` is the protocol as the task's config
  runs it (the ``paper`` protocol keeps what the reference code kept: ``paper_selection``);
* evaluation: ``evaluate(model, split, ctx)`` -- by default a forward pass over the split's
  loader with every metric updated per batch; a task replaces it (greedy decoding then BLEU,
  rollouts in an environment, sliding-window perplexity) without the trainer changing.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, ClassVar
from collections.abc import Callable, Collection

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import Dataset

from bench_cli.core.metrics import accumulate, Accuracy, by_name, compute_all, CrossEntropy, full_precision, Metric
from bench_cli.core.errors import UserError, unknown_choice
from bench_cli.core.fetch import FETCHERS
# the protocols are torch-free data (records and `ls runs` read them): re-exported as the task contract's
from bench_cli.core.protocols import PAPER_SELECTIONS, PROTOCOL_SPLITS, PROTOCOLS, Protocol  # noqa: F401


def to_device(batch: dict, device: torch.device) -> dict:
    return {k: v.to(device, non_blocking=True) if torch.is_tensor(v) else v for k, v in batch.items()}


# A model output as a loss takes it (bench_cli.core.metrics.full_precision: autocast's bf16 / fp16
# logits in float32; a float64 run's loss stays float64, as the tests compare it).
loss_precision = full_precision


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


class TransformedDataset(Dataset):
    """``transform(sample)`` applied to every sample of ``base`` when it is read (in the workers)."""

    def __init__(self, base: Dataset, transform: Callable[[dict], dict]):
        self.base, self.transform = base, transform

    def __len__(self) -> int:
        return len(self.base)

    def __getitem__(self, i):
        return self.transform(self.base[i])


@dataclass
class EvalContext:
    """What an evaluator may use: the split's loader (the task's collate and transforms), the
    device, a progress callback (one call per batch) and ``reduce``, which sums the metrics'
    statistics over the processes of a distributed run (each process sees its shard of the split;
    identity otherwise): an evaluator calls it on its sums before computing the metrics.
    ``metrics``: the names wanted (None: all); an evaluator may skip the work of the others."""

    loader: Callable[[str], Any]
    device: torch.device
    advance: Callable[[], None] = lambda: None
    reduce: Callable[[dict], dict] = lambda stats: stats
    metrics: Collection[str] | None = None
    # called with each batch's per-sample outputs (Task.sample_outputs) when the caller keeps them
    # (the reported test evaluation: bench_cli/results/samples.py); None: not kept
    keep: Callable[[dict], None] | None = None

    def wants(self, metric: Metric) -> bool:
        return self.metrics is None or metric.name in self.metrics


class Task:
    """Base class; subclasses set ``name`` (= ``conf/task/<name>.yaml``'s ``name``), register
    with ``@tasks.register_task`` and implement the data and model hooks."""

    name: ClassVar[str]
    # Metrics, the first one the default selection; classification by default.
    metrics: ClassVar[tuple[Metric, ...]] = (Accuracy(), CrossEntropy())
    selection: ClassVar[str] = "accuracy"
    # Capabilities every attention layer must have for this task (models.attention.Capabilities fields).
    requires: ClassVar[dict[str, bool]] = {}
    # The dataset source of `attnbench data` (tasks.fetch) that serves this task: it alone says
    # whether a dataset is present.
    fetcher: ClassVar[str | None] = None
    # The datasets the task reads, when only some of its fetcher's (None: every one).
    DATASETS: ClassVar[tuple[str, ...] | None] = None
    # The protocols the task supports ('holdout': a validation split selects; 'paper': TEST does).
    protocols: ClassVar[tuple[str, ...]] = PROTOCOLS
    # The settings that size a split carved from the data (tasks.data.validation_split, nmt's split),
    # named when one comes out empty.
    SPLIT_FRACTIONS: ClassVar[dict[str, str]] = {"val": "val_fraction", "test": "test_fraction"}

    def __init__(self, cfg, data_root: str | Path):
        self.cfg = cfg
        self.data_root = Path(data_root).expanduser()
        self.splits: dict[str, Dataset] = {}
        self.located = None  # what the fetcher's check found (a folder, a loaded HF dataset), for setup

    # --- data -------------------------------------------------------------------------------
    @classmethod
    def datasets(cls, data_root: Path | None = None) -> list[str]:
        """Dataset names the task reads: ``DATASETS``, or by default those of its fetcher."""
        if cls.DATASETS is not None:
            return list(cls.DATASETS)
        return FETCHERS.get(cls.fetcher).datasets(data_root) if cls.fetcher else []

    @property
    def dataset_name(self) -> str:
        return str(self.cfg.get("dataset", self.name))

    def data_options(self) -> dict:
        """What the fetcher's ``require`` needs from the config (``cached``: preprocessed copies
        that make the source unnecessary; a choice of files such as Pathfinder's difficulty)."""
        return {}

    def check_dataset_name(self) -> None:
        """UserError for a dataset the task does not read (its fetcher judges other names)."""
        if self.DATASETS is not None and self.dataset_name not in self.DATASETS:
            raise unknown_choice(f"{self.name} dataset", self.dataset_name, self.DATASETS)

    def check_data(self) -> None:
        """Raise UserError for a dataset the task does not read, or the fetcher's one-line
        DataNotFoundError (where to put it, how to fetch it) if it is absent. Reads no data."""
        self.check_dataset_name()
        self.located = FETCHERS.get(self.fetcher).require(self.dataset_name, self.data_root, **self.data_options())

    @classmethod
    def check_protocol(cls, protocol: str) -> None:
        if protocol not in cls.protocols:
            raise unknown_choice("task.protocol", protocol, cls.protocols)

    @staticmethod
    def paper_selection(task_cfg) -> str:
        """``task.paper_selection`` (``best`` when the config has none); an unknown one is one line
        naming the choices, whatever the protocol (``validate`` and ``run`` both ask here)."""
        keeps = str((task_cfg or {}).get("paper_selection") or "best")
        if keeps not in PAPER_SELECTIONS:
            raise unknown_choice("task.paper_selection", keeps, PAPER_SELECTIONS)
        return keeps

    def resolve_protocol(self, name: str) -> Protocol:
        """The protocol ``name`` as this task's config runs it: holdout keeps the best validation
        evaluation; ``paper`` keeps the TEST evaluation the reference code reported, by
        ``task.paper_selection``."""
        self.check_protocol(name)
        keeps = self.paper_selection(self.cfg)
        protocol = PROTOCOL_SPLITS[name]
        return protocol if protocol.holds_out else replace(protocol, keeps=keeps)

    def setup(self, protocol: str) -> None:
        """Check the protocol and the data (one line each), then fill ``splits`` (``make_splits``).
        Under the paper protocol TEST selects: no validation split is kept."""
        self.resolve_protocol(protocol)
        self.check_data()
        self.make_splits(protocol)
        if protocol == "paper":
            self.splits.pop("val", None)
        self.check_splits_hold_samples(protocol)

    def evaluated_splits(self, protocol: str) -> tuple[str, ...]:
        """The splits ``evaluate`` reads through the loaders under ``protocol`` (a task whose
        evaluator reads no split, such as rollouts in an environment, returns none)."""
        return ("val", "test") if PROTOCOL_SPLITS[protocol].holds_out else ("test",)

    def check_splits_hold_samples(self, protocol: str) -> None:
        """One line, before any training, for a split without a sample: an empty training split
        trains nothing, and an empty evaluated one gives an evaluation without its metrics (the
        selection metric missing at the first evaluation, whatever the schedule). A small dataset
        under a fraction meant for a large one does that (nmt's 0.1 % validation pairs of a corpus
        under 1,000 pairs)."""
        for split in ("train", *self.evaluated_splits(protocol)):
            if split not in self.splits or len(self.splits[split]) == 0:
                raise UserError(f"{self.name}: the {split} split of {self.dataset_name} is empty "
                                f"({self.split_size_settings(split)}); a run needs at least one {split} sample")

    def split_size_settings(self, split: str) -> str:
        """What decided the size of ``split``, for the message of an empty one."""
        settings = []
        fraction = self.SPLIT_FRACTIONS.get(split)
        if fraction and self.cfg.get(fraction) is not None:
            settings.append(f"task.{fraction}={self.cfg.get(fraction)}: raise it, or use a larger dataset")
        subset = (self.cfg.get("subset") or {}).get(split)
        if subset:
            settings.append(f"task.subset.{split}={subset}")
        return "; ".join(settings) or "the dataset has none"

    def make_splits(self, protocol: str) -> None:
        """Load and preprocess; fill ``self.splits`` with 'train', 'test' and (holdout) 'val'."""
        raise NotImplementedError

    def transform(self, split: str) -> Callable[[dict], dict] | None:
        """Per-sample transform of ``split`` (augmentation), run in the loader's workers."""
        return None

    def collate(self, split: str) -> Callable[[list], dict] | None:
        """Batch collation of ``split``; None = stack equally shaped tensors."""
        return None

    def sampler(self, split: str, dataset: Dataset, generator: torch.Generator):
        """A sampler for ``split`` (e.g. repeated augmentation); None = shuffle the training split
        (in a distributed run: the trainer's DistributedSampler / evaluation shards). A sampler
        returned during a distributed run must shard over the processes itself
        (``torch.distributed`` rank and world size), as DeiT's repeated-augmentation sampler does."""
        return None

    def dataset(self, split: str) -> Dataset:
        """``splits[split]`` with the split's transform applied."""
        data = self.splits[split]
        fn = self.transform(split)
        return TransformedDataset(data, fn) if fn is not None else data

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

    def attention_stacks(self) -> dict[str, int]:
        """Attention roles of the model and their number of layers: 'encoder' (self-attention),
        'decoder' (causal self-attention), 'cross' (attends to an encoded context)."""
        return {"encoder": int(self.cfg.backbone.n_layers)}

    def batch_len(self, batch: dict) -> int:
        """Number of samples in a batch (for per-sample measurements)."""
        return int(next(iter(self.model_inputs(batch).values())).shape[0])

    # --- loss, metrics, evaluation --------------------------------------------------------------
    def loss(self, output: torch.Tensor, batch: dict) -> torch.Tensor:
        return F.cross_entropy(output, batch["y"])

    def selection_metric(self) -> Metric:
        return by_name(self.metrics, self.selection)

    def loss_metric(self) -> Metric | None:
        return next((m for m in self.metrics if m.name == "loss"), None)

    def batch_stats(self, output, batch: dict) -> dict[str, float]:
        """Summable statistics of every declared metric that a batch's output gives (``per_batch``;
        BLEU and rollout returns come from the task's evaluator)."""
        stats: dict[str, float] = {}
        for m in self.metrics:
            if m.per_batch:
                stats.update(m.update(output, batch))
        return stats

    @torch.no_grad()
    def evaluate(self, model: nn.Module, split: str, ctx: EvalContext) -> dict[str, float]:
        """The default evaluator: forward every batch of ``split``, sum the metrics' statistics."""
        model.eval()
        stats: dict[str, float] = {}
        for batch in ctx.loader(split):
            batch = to_device(batch, ctx.device)
            output = model(**self.model_inputs(batch))
            accumulate(stats, self.batch_stats(output, batch))
            if ctx.keep is not None and (kept := self.sample_outputs(output, batch)) is not None:
                ctx.keep(kept)
            ctx.advance()
        return compute_all(self.metrics, ctx.reduce(stats))

    def sample_outputs(self, output, batch: dict) -> dict[str, torch.Tensor] | None:
        """Per-sample outputs of an evaluation batch, kept beside the record so that two models can
        be compared on the same test samples (paired tests): ``prediction``, ``target`` and ``loss``
        (one value per sample). The default serves classification (logits (batch, classes), labels
        ``y``: the arg-max and the cross-entropy); None where the output is not that (a task
        overrides it: regression's squared errors)."""
        y = batch.get("y")
        if not (torch.is_tensor(output) and output.dim() == 2 and torch.is_tensor(y) and y.dim() == 1
                and len(y) == len(output) and not y.is_floating_point()):
            return None
        return {"prediction": output.argmax(-1), "target": y,
                "loss": F.cross_entropy(output.float(), y, reduction="none")}

    # Metrics a batch cannot give (per_batch=False) that the papers also report on TRAIN, so that
    # trainer.train_metrics=batches evaluates the training split for them with the reported
    # weights (translation's train BLEU, papers/002 Tables 3, 10). A task whose evaluator has no
    # meaning on TRAIN (rollouts, sliding-window perplexity) leaves it empty.
    train_split_metrics: ClassVar[tuple[str, ...]] = ()

    def describe(self) -> dict:
        """Facts about the loaded data for the summary and the record (shapes, classes...)."""
        return {}
