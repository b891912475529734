"""The metric abstraction (bench_cli/core/metrics.py) on hand-made batches."""
from __future__ import annotations

import math

import pytest
import torch

from bench_cli.core import metrics as M


def totals(metric, batches):
    stats = {}
    for output, batch in batches:
        M.accumulate(stats, metric.update(output, batch))
    return metric.compute(stats)


def test_accuracy_and_top5_sum_over_batches():
    logits = torch.tensor([[0.1, 0.9, 0.0, 0.01, 0.02, 0.03], [0.8, 0.1, 0.05, 0.01, 0.02, 0.7],
                           [0.1, 0.2, 0.3, 0.4, 0.5, 1.0]])
    y = torch.tensor([1, 5, 0])
    batches = [(logits[:2], {"y": y[:2]}), (logits[2:], {"y": y[2:]})]
    assert totals(M.Accuracy(), batches) == pytest.approx(100 / 3)  # only the first is right
    # top-5: sample 2's class 5 ranks second (in); sample 3's class 0 ranks sixth (out)
    assert totals(M.top5_accuracy(), batches) == pytest.approx(200 / 3)
    soft = torch.tensor([[0.2, 0.8, 0, 0, 0, 0]])  # mixup targets count by their argmax
    assert totals(M.Accuracy(), [(logits[:1], {"y": soft})]) == 100.0


def test_cross_entropy_ignores_padding_and_perplexity_is_its_exp():
    logits = torch.log(torch.tensor([[[0.5, 0.5], [0.25, 0.75], [0.9, 0.1]]]))
    y = torch.tensor([[0, 1, -100]])
    nll = (-math.log(0.5) - math.log(0.75)) / 2
    assert totals(M.CrossEntropy(), [(logits, {"y": y})]) == pytest.approx(nll)
    assert totals(M.Perplexity(), [(logits, {"y": y})]) == pytest.approx(math.exp(nll))


def test_regression_metrics_are_on_the_raw_scale():
    out = torch.tensor([[1.0], [2.0], [4.0]])
    y = torch.tensor([1.0, 4.0, 1.0])
    batches = [(out[:1], {"y": y[:1]}), (out[1:], {"y": y[1:]})]
    assert totals(M.RMSE(), batches) == pytest.approx(math.sqrt((0 + 4 + 9) / 3))
    assert totals(M.MAE(), batches) == pytest.approx(5 / 3)
    assert totals(M.MSE(), batches) == pytest.approx(13 / 3)


def test_mean_of_evaluator_values():
    batches = [(None, {"normalized_return": [10.0, 20.0]}), (None, {"normalized_return": torch.tensor([60.0])})]
    assert totals(M.Mean("normalized_return"), batches) == pytest.approx(30.0)


def test_direction_decides_best_and_selection_keys():
    acc, rmse, loss = M.Accuracy(), M.RMSE(), M.CrossEntropy()
    assert acc.better(0.9, 0.8) and not rmse.better(0.9, 0.8) and rmse.better(0.1, 0.2)
    assert acc.best([1, 3, 2]) == 3 and rmse.best([1, 3, 2]) == 1
    # ties on the selection metric go to the lower loss
    a = M.selection_key(acc, {"accuracy": 90.0, "loss": 0.3}, loss)
    b = M.selection_key(acc, {"accuracy": 90.0, "loss": 0.2}, loss)
    assert b > a
    assert M.selection_key(rmse, {"rmse": 1.0}) > M.selection_key(rmse, {"rmse": 2.0})


def test_stats_of_several_metrics_share_one_dict_without_clashing():
    out, batch = torch.tensor([[2.0, 1.0]]), {"y": torch.tensor([0])}
    stats = {}
    for m in (M.Accuracy(), M.CrossEntropy()):
        M.accumulate(stats, m.update(out, batch))
    assert set(stats) == {"accuracy.correct", "accuracy.n", "loss.sum", "loss.n"}
    assert M.compute_all((M.Accuracy(), M.CrossEntropy(), M.RMSE()), stats).keys() == {"accuracy", "loss"}
