"""Metrics: a name, a direction, summable per-batch statistics and a final value.

Every task declares its metrics and which one selects the model (``Task.metrics``,
``Task.selection``). Everything that compares results -- the trainer's epoch selection and early
stopping, the ``paper`` protocol (best test evaluation: highest accuracy, lowest RMSE...), the
summary, sweeps and reports -- asks the metric for its direction; nothing assumes accuracy.

A metric turns one batch into statistics that add up over batches (``update``), so evaluation
never keeps predictions around and a distributed run can sum them across ranks; ``compute``
turns the sums into the number. Statistic names are prefixed with the metric's name, so several
metrics share one dict of sums.

Statistics read from a batch's tensors stay on the device as 0-dim float64 tensors (a
``float()`` per batch is a host-device sync per training step on CUDA) and are summed there
(``accumulate``); ``compute``/``compute_all`` read them to the host once (``host_values``).
Counts the host already knows (``numel``) and values that live on the host (BLEU's n-gram counts
of strings) are Python floats. Casting each batch's value to float64 before summing keeps the sums
bitwise those of the Python floats (float64) that a ``float()`` per batch added in the same order.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
import torch
import torch.nn.functional as F

# statistic name -> its sum so far: a 0-dim float64 tensor (on the device) or a Python float
Stats = dict[str, "torch.Tensor | float"]


@dataclass(frozen=True)
class Metric:
    """Base: ``name``, ``higher_is_better``; subclasses implement ``update`` and ``value`` (the
    number from host sums; ``compute`` reads device sums first).
    ``per_batch``: ``update`` reads the model's output on a batch, so the metric can also be taken
    over training batches (``trainer.train_metrics``); False for values only a task's evaluator
    produces (BLEU of greedy decoding, returns of rollouts)."""

    name: str
    higher_is_better: bool = True
    per_batch: bool = True

    def update(self, output, batch: dict) -> Stats:
        raise NotImplementedError

    def value(self, sums: dict[str, float]) -> float:
        """The metric from its statistics' sums as Python floats."""
        raise NotImplementedError

    def compute(self, stats: Stats) -> float:
        """The metric from summed statistics (device tensors are read here, at once)."""
        return self.value(host_values({k: v for k, v in stats.items() if k.startswith(self.name + ".")}))

    # --- direction ------------------------------------------------------------------------------
    def better(self, a: float, b: float) -> bool:
        """True when ``a`` is strictly better than ``b``."""
        return a > b if self.higher_is_better else a < b

    def sort_key(self, value: float) -> float:
        """A key that is larger for better values (for max())."""
        return value if self.higher_is_better else -value

    def best(self, values):
        return max(values, key=self.sort_key)

    @property
    def direction(self) -> str:
        return "higher is better" if self.higher_is_better else "lower is better"

    def stat(self, key: str) -> str:
        return f"{self.name}.{key}"


def full_precision(values: torch.Tensor) -> torch.Tensor:
    """Half precision (autocast's bf16 / fp16 model outputs) in float32; float32 and float64 as they
    are. A metric compares an output with its targets in this precision, never the targets rounded
    to the output's half precision (bf16 keeps 8 bits: a regression target of 300.7 becomes 300)."""
    return values.float() if values.dtype in (torch.float16, torch.bfloat16) else values


# --- classification -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Accuracy(Metric):
    """Percentage of samples whose top-k classes contain the target (k = 1: accuracy). Soft
    targets (mixup) count by their argmax, as timm does. With ``ignore_index``, targets equal to
    it are not counted (token accuracy of padded sequences)."""

    name: str = "accuracy"
    k: int = 1
    target: str = "y"
    ignore_index: int | None = None

    def update(self, output, batch):
        y = batch[self.target]
        if y.dim() == output.dim():  # soft / one-hot targets
            y = y.argmax(-1)
        if self.k == 1:
            hit = output.argmax(-1) == y
        else:
            top = output.topk(min(self.k, output.shape[-1]), dim=-1).indices
            hit = (top == y.unsqueeze(-1)).any(-1)
        if self.ignore_index is None:
            return {self.stat("correct"): hit.sum().double(), self.stat("n"): float(y.numel())}
        valid = y != self.ignore_index
        return {self.stat("correct"): (hit & valid).sum().double(), self.stat("n"): valid.sum().double()}

    def value(self, sums):
        return 100.0 * sums[self.stat("correct")] / max(sums[self.stat("n")], 1.0)


def top5_accuracy() -> Accuracy:
    return Accuracy(name="top5_accuracy", k=5)


@dataclass(frozen=True)
class CrossEntropy(Metric):
    """Mean cross-entropy per sample (per token for sequence outputs with ``ignore_index``)."""

    name: str = "loss"
    higher_is_better: bool = False
    target: str = "y"
    ignore_index: int = -100

    def update(self, output, batch):
        y = batch[self.target]
        if y.dim() == output.dim():  # soft targets
            total = -(y * F.log_softmax(output.float(), -1)).sum()
            n = float(y.shape[0])
        else:
            logits = output.reshape(-1, output.shape[-1]).float()
            y = y.reshape(-1)
            total = F.cross_entropy(logits, y, reduction="sum", ignore_index=self.ignore_index)
            n = (y != self.ignore_index).sum().double()
        return {self.stat("sum"): total.double(), self.stat("n"): n}

    def value(self, sums):
        return sums[self.stat("sum")] / max(sums[self.stat("n")], 1.0)


@dataclass(frozen=True)
class Perplexity(CrossEntropy):
    """exp(mean token negative log-likelihood), lower is better."""

    name: str = "perplexity"

    def value(self, sums):
        return math.exp(min(super().value(sums), 700.0))


# --- regression -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class RMSE(Metric):
    """Root mean squared error over every target value (on the targets' own scale)."""

    name: str = "rmse"
    higher_is_better: bool = False
    target: str = "y"

    def update(self, output, batch):
        output = full_precision(output)
        y = batch[self.target].to(output.dtype)
        err = (output.reshape(y.shape) - y).double()
        return {self.stat("sse"): (err * err).sum(), self.stat("n"): float(y.numel())}

    def value(self, sums):
        return math.sqrt(sums[self.stat("sse")] / max(sums[self.stat("n")], 1.0))


@dataclass(frozen=True)
class MSE(RMSE):
    """Mean squared error (the regression loss, reported as ``loss``)."""

    name: str = "loss"

    def value(self, sums):
        return sums[self.stat("sse")] / max(sums[self.stat("n")], 1.0)


@dataclass(frozen=True)
class MAE(Metric):
    name: str = "mae"
    higher_is_better: bool = False
    target: str = "y"

    def update(self, output, batch):
        output = full_precision(output)
        y = batch[self.target].to(output.dtype)
        return {self.stat("sae"): (output.reshape(y.shape) - y).abs().double().sum(),
                self.stat("n"): float(y.numel())}

    def value(self, sums):
        return sums[self.stat("sae")] / max(sums[self.stat("n")], 1.0)


# --- values an evaluator computes itself (BLEU, returns) ------------------------------------------
@dataclass(frozen=True)
class Mean(Metric):
    """The mean of values an evaluator reports per item (``batch[name]``): returns of episodes,
    a score per sentence. ``update`` reads ``batch[self.name]`` (a tensor or a list of numbers)."""

    per_batch: bool = False

    def update(self, output, batch):
        values = torch.as_tensor(batch[self.name], dtype=torch.float64)
        return {self.stat("sum"): values.sum(), self.stat("n"): float(values.numel())}

    def value(self, sums):
        return sums[self.stat("sum")] / max(sums[self.stat("n")], 1.0)


def sacrebleu_bleu():
    """sacrebleu's BLEU class (the text extra)."""
    from bench_cli.core.extras import require

    return require("sacrebleu.metrics", "text", "BLEU").BLEU


@dataclass(frozen=True)
class BLEU(Metric):
    """Corpus BLEU (sacrebleu, 0-100) of decoded hypotheses against one reference each.

    ``update`` reads ``batch['hypotheses']`` and ``batch['references']`` (lists of strings) and
    returns sacrebleu's sufficient statistics (matching and total n-grams of each order, system
    and reference lengths). They add up over batches exactly as sacrebleu sums them over
    sentences, so ``compute`` of the sums is the corpus BLEU of the whole split
    (``sacrebleu.corpus_bleu``, same tokeniser and its default exponential smoothing)."""

    name: str = "bleu"
    per_batch: bool = False
    tokenize: str = "13a"
    max_order: int = 4

    def scorer(self):
        return sacrebleu_bleu()(tokenize=self.tokenize, max_ngram_order=self.max_order)

    def signature(self) -> str:
        """sacrebleu's signature of the scorer (one reference, tokeniser, smoothing, version)."""
        scorer = self.scorer()
        scorer.corpus_score(["a"], [["a"]])  # the signature needs the number of references
        return str(scorer.get_signature())

    def update(self, output, batch):
        hyps, refs = list(batch["hypotheses"]), list(batch["references"])
        if len(hyps) != len(refs):
            raise ValueError(f"{len(hyps)} hypotheses for {len(refs)} references")
        if not hyps:
            return {}
        score = self.scorer().corpus_score(hyps, [refs])
        stats = {self.stat("sys_len"): float(score.sys_len), self.stat("ref_len"): float(score.ref_len)}
        for n in range(self.max_order):
            stats[self.stat(f"correct_{n + 1}")] = float(score.counts[n])
            stats[self.stat(f"total_{n + 1}")] = float(score.totals[n])
        return stats

    def value(self, sums):
        orders = range(1, self.max_order + 1)
        return float(sacrebleu_bleu().compute_bleu(
            correct=[int(sums[self.stat(f"correct_{n}")]) for n in orders],
            total=[int(sums[self.stat(f"total_{n}")]) for n in orders],
            sys_len=int(sums[self.stat("sys_len")]), ref_len=int(sums[self.stat("ref_len")]),
            smooth_method="exp", max_ngram_order=self.max_order).score)


def host_values(stats: Stats) -> dict[str, float]:
    """The statistics as Python floats: the device tensors read in one transfer per device (one
    sync, not one per statistic); float64 ``tolist`` is exact."""
    on_device: dict[torch.device, list[str]] = {}
    for k, v in stats.items():
        if isinstance(v, torch.Tensor):
            on_device.setdefault(v.device, []).append(k)
    values = {k: float(v) for k, v in stats.items() if not isinstance(v, torch.Tensor)}
    for keys in on_device.values():
        values.update(zip(keys, torch.stack([stats[k].double().reshape(()) for k in keys]).tolist()))
    return {k: values[k] for k in stats}


def compute_all(metrics, stats: Stats) -> dict[str, float]:
    """Every metric's value from the summed statistics (metrics without statistics are left out)."""
    sums = host_values(stats)
    return {m.name: m.value(sums) for m in metrics if any(k.startswith(m.name + ".") for k in sums)}


def accumulate(total: Stats, stats: Stats) -> Stats:
    """Adds a batch's statistics to the sums: device tensors on the device (no host read), Python
    floats on the host; a float and a tensor add up to a tensor."""
    for k, v in stats.items():
        total[k] = total.get(k, 0.0) + v
    return total


def by_name(metrics, name: str) -> Metric:
    for m in metrics:
        if m.name == name:
            return m
    raise KeyError(f"no metric '{name}' (declared: {', '.join(m.name for m in metrics)})")


def selection_key(metric: Metric, result: dict[str, float], tie_breaker: Metric | None = None) -> tuple:
    """Ordering of evaluations for model selection: the selection metric in its direction, ties to
    the better ``tie_breaker`` (the loss). Larger is better."""
    key = (metric.sort_key(result[metric.name]),)
    if tie_breaker is not None and tie_breaker.name in result and tie_breaker is not metric:
        key += (tie_breaker.sort_key(result[tie_breaker.name]),)
    return key

