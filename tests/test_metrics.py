"""The metric abstraction (bench_cli/core/metrics.py) on hand-made batches."""
from __future__ import annotations

import math

import pytest
import torch

from bench_cli.core import metrics


def totals(metric, batches):
    stats = {}
    for output, batch in batches:
        metrics.accumulate(stats, metric.update(output, batch))
    return metric.compute(stats)


def test_accuracy_and_top5_sum_over_batches():
    logits = torch.tensor([[0.1, 0.9, 0.0, 0.01, 0.02, 0.03], [0.8, 0.1, 0.05, 0.01, 0.02, 0.7],
                           [0.1, 0.2, 0.3, 0.4, 0.5, 1.0]])
    y = torch.tensor([1, 5, 0])
    batches = [(logits[:2], {"y": y[:2]}), (logits[2:], {"y": y[2:]})]
    assert totals(metrics.Accuracy(), batches) == pytest.approx(100 / 3)  # only the first is right
    # top-5: sample 2's class 5 ranks second (in); sample 3's class 0 ranks sixth (out)
    assert totals(metrics.top5_accuracy(), batches) == pytest.approx(200 / 3)
    soft = torch.tensor([[0.2, 0.8, 0, 0, 0, 0]])  # mixup targets count by their argmax
    assert totals(metrics.Accuracy(), [(logits[:1], {"y": soft})]) == 100.0


def test_cross_entropy_ignores_padding_and_perplexity_is_its_exp():
    logits = torch.log(torch.tensor([[[0.5, 0.5], [0.25, 0.75], [0.9, 0.1]]]))
    y = torch.tensor([[0, 1, -100]])
    nll = (-math.log(0.5) - math.log(0.75)) / 2
    assert totals(metrics.CrossEntropy(), [(logits, {"y": y})]) == pytest.approx(nll)
    assert totals(metrics.Perplexity(), [(logits, {"y": y})]) == pytest.approx(math.exp(nll))


def test_regression_metrics_are_on_the_raw_scale():
    out = torch.tensor([[1.0], [2.0], [4.0]])
    y = torch.tensor([1.0, 4.0, 1.0])
    batches = [(out[:1], {"y": y[:1]}), (out[1:], {"y": y[1:]})]
    assert totals(metrics.RMSE(), batches) == pytest.approx(math.sqrt((0 + 4 + 9) / 3))
    assert totals(metrics.MAE(), batches) == pytest.approx(5 / 3)
    assert totals(metrics.MSE(), batches) == pytest.approx(13 / 3)


@pytest.mark.parametrize("half", [torch.bfloat16, torch.float16])
def test_regression_metrics_keep_the_targets_precision_under_half_precision_outputs(half):
    """Under bf16 / fp16 autocast a regression head's output is half precision; the float32 targets
    are not rounded to it (bf16 holds 300.7 as 300.0, fp16 holds 3000.7 as 3000.0)."""
    y = torch.tensor([300.7, 3000.7])
    out = torch.tensor([[300.0], [3000.0]], dtype=half)
    errors = (out.float().squeeze(-1) - y).double()
    assert totals(metrics.RMSE(), [(out, {"y": y})]) == pytest.approx(math.sqrt((errors ** 2).mean().item()))
    assert totals(metrics.MAE(), [(out, {"y": y})]) == pytest.approx(errors.abs().mean().item())


def test_mean_of_evaluator_values():
    batches = [(None, {"normalized_return": [10.0, 20.0]}), (None, {"normalized_return": torch.tensor([60.0])})]
    assert totals(metrics.Mean("normalized_return"), batches) == pytest.approx(30.0)


def test_direction_decides_best_and_selection_keys():
    acc, rmse, loss = metrics.Accuracy(), metrics.RMSE(), metrics.CrossEntropy()
    assert acc.better(0.9, 0.8) and not rmse.better(0.9, 0.8) and rmse.better(0.1, 0.2)
    assert acc.best([1, 3, 2]) == 3 and rmse.best([1, 3, 2]) == 1
    # ties on the selection metric go to the lower loss
    a = metrics.selection_key(acc, {"accuracy": 90.0, "loss": 0.3}, loss)
    b = metrics.selection_key(acc, {"accuracy": 90.0, "loss": 0.2}, loss)
    assert b > a
    assert metrics.selection_key(rmse, {"rmse": 1.0}) > metrics.selection_key(rmse, {"rmse": 2.0})


def test_stats_of_several_metrics_share_one_dict_without_clashing():
    out, batch = torch.tensor([[2.0, 1.0]]), {"y": torch.tensor([0])}
    stats = {}
    for m in (metrics.Accuracy(), metrics.CrossEntropy()):
        metrics.accumulate(stats, m.update(out, batch))
    assert set(stats) == {"accuracy.correct", "accuracy.n", "loss.sum", "loss.n"}
    assert metrics.compute_all((metrics.Accuracy(), metrics.CrossEntropy(), metrics.RMSE()), stats).keys() == {"accuracy", "loss"}


# --- statistics on the device (a host read per batch is a host-device sync on CUDA) ---------------
def host_path(metric_value, per_batch_stats, batches) -> float:
    """The former host path, transcribed: each batch's statistics read with float() and summed in
    order as Python floats, then the metric's formula."""
    sums = {}
    for output, y in batches:
        for key, value in per_batch_stats(output, y).items():
            sums[key] = sums.get(key, 0.0) + float(value)
    return metric_value(sums)


def random_batches(shape_of, n_batches=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [shape_of(g, int(torch.randint(3, 9, (), generator=g))) for _ in range(n_batches)]


def device_path(metric, batches):
    """The statistics as the trainer sums them (tensors, never read) and the metric from them."""
    stats = {}
    for output, y in batches:
        metrics.accumulate(stats, metric.update(output, {"y": y}))
    return stats, metric.compute(stats), metrics.compute_all([metric], stats)[metric.name]


def test_device_statistics_give_exactly_the_host_values():
    tokens = random_batches(lambda g, b: (3 * torch.randn(b, 7, 11, generator=g), torch.randint(0, 11, (b, 7), generator=g)))
    soft = random_batches(lambda g, b: (3 * torch.randn(b, 6, generator=g), torch.randn(b, 6, generator=g).softmax(-1)))
    values = random_batches(lambda g, b: (10 * torch.randn(b, 3, generator=g), 10 * torch.randn(b, 3, generator=g)))

    def token_hits(out, y):
        valid = y != 0
        return {"correct": ((out.argmax(-1) == y) & valid).sum(), "n": valid.sum()}

    def soft_nll(out, y):
        return {"sum": -(y * torch.log_softmax(out, -1)).sum(), "n": y.shape[0]}

    def token_nll(out, y):
        logits, y = out.reshape(-1, out.shape[-1]), y.reshape(-1)
        return {"sum": torch.nn.functional.cross_entropy(logits, y, reduction="sum", ignore_index=0), "n": (y != 0).sum()}

    def errors(out, y):
        err = (out - y).double()
        return {"sse": (err * err).sum(), "sae": err.abs().sum(), "n": y.numel()}

    def mean(key):
        return lambda s: s[key] / max(s["n"], 1.0)

    cases = [
        (metrics.Accuracy(ignore_index=0), tokens, token_hits, lambda s: 100.0 * s["correct"] / max(s["n"], 1.0)),
        (metrics.CrossEntropy(), soft, soft_nll, mean("sum")),
        (metrics.CrossEntropy(ignore_index=0), tokens, token_nll, mean("sum")),
        (metrics.RMSE(), values, errors, lambda s: math.sqrt(mean("sse")(s))),
        (metrics.MAE(), values, errors, mean("sae")),
    ]
    for metric, batches, per_batch, formula in cases:
        stats, computed, from_all = device_path(metric, batches)
        expected = host_path(formula, per_batch, batches)
        assert computed == from_all == expected, (metric, computed, expected)
        summed = [k for k in stats if k.split(".")[1] in ("correct", "sum", "sse", "sae")]
        assert all(isinstance(stats[k], torch.Tensor) and stats[k].dtype == torch.float64 for k in summed), stats


def test_accumulate_takes_device_and_host_statistics():
    stats = metrics.accumulate({}, {"a.x": torch.tensor(1.5, dtype=torch.float64), "a.n": 2.0})
    metrics.accumulate(stats, {"a.x": 0.25, "a.n": torch.tensor(1.0, dtype=torch.float64), "b.x": 3.0})
    assert metrics.host_values(stats) == {"a.x": 1.75, "a.n": 3.0, "b.x": 3.0}
    assert isinstance(stats["a.x"], torch.Tensor) and stats["b.x"] == 3.0
