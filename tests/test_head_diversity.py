"""Head diversity (primal-dual Table 4; bench_cli/engine/head_diversity.py) against an independent float64
loop: each head's softmax output recomputed from the layer's weights and input, distances summed
position by position, mean and population std per layer by hand, then averaged over layers."""
from __future__ import annotations

import copy
import math

import pytest
import torch
from omegaconf import open_dict

from bench_cli.config.compose import compose
from bench_cli.engine.head_diversity import head_diversity, record_head_diversity
from bench_cli.config.taskfit import build_task

SMALL = ["task=lra_listops", "task.backbone.d_model=16", "task.backbone.d_ff=32", "task.backbone.n_heads=4",
         "task.backbone.n_layers=2"]


def tiny_lra(model: str, *extra: str):
    cfg = compose([*SMALL, f"model={model}", *extra])
    task = build_task(cfg)
    task.setup_synthetic(12)
    torch.manual_seed(0)
    net = task.build_model(cfg.model)
    batch = task.synthetic_batch(3, 12)
    batch["x"][0, 8:] = 0  # padding (id 0): sample 0 has 8 real tokens, sample 1 has 5
    batch["x"][1, 5:] = 0
    return cfg, task, net, batch


def layer_inputs(net, task, batch) -> list[tuple]:
    """(attention module, its input x, its mask) of every attention call, by a plain forward hook."""
    from bench_cli.engine.head_diversity import attention_layers

    calls, handles = [], []
    for layer in attention_layers(net):
        def hook(module, args, kwargs, _layer=layer):
            calls.append((_layer, args[0], args[1] if len(args) > 1 else kwargs.get("mask")))
        handles.append(layer.register_forward_pre_hook(hook, with_kwargs=True))
    net.eval()
    with torch.no_grad():
        net(**task.model_inputs(batch))
    for h in handles:
        h.remove()
    return calls


def reference_softmax_diversity(calls) -> tuple[float, float]:
    """Loops over samples, heads, pairs and positions (softmax attention, eval mode)."""
    means, stds = [], []
    for layer, x, mask in calls:
        h, dh = layer.n_heads, layer.d_head
        distances = []
        for b in range(x.shape[0]):
            real = [i for i in range(x.shape[1]) if bool(mask[b, i])]
            q = layer.q_proj(x[b]).view(-1, h, dh)
            k = layer.k_proj(x[b]).view(-1, h, dh)
            v = layer.v_proj(x[b]).view(-1, h, dh)
            out = torch.zeros(h, len(real), dh, dtype=torch.float64)
            for head in range(h):
                for row, i in enumerate(real):
                    scores = torch.stack([q[i, head] @ k[j, head] / math.sqrt(dh) for j in real])
                    weights = torch.softmax(scores, dim=0)
                    out[head, row] = sum(w * v[j, head] for w, j in zip(weights, real))
            for a in range(h):
                for c in range(a + 1, h):
                    distances.append(math.sqrt(sum(float(((out[a, r] - out[c, r]) ** 2).sum()) for r in range(len(real)))))
        mean = sum(distances) / len(distances)
        means.append(mean)
        stds.append(math.sqrt(sum((d - mean) ** 2 for d in distances) / len(distances)))
    return sum(means) / len(means), sum(stds) / len(stds)


def test_head_diversity_equals_an_independent_loop(float64_single_thread):
    _, task, net, batch = tiny_lra("softmax")
    net.train()
    got = head_diversity(net, task, batch)
    assert net.training  # measured in eval mode, the model's mode restored
    with torch.no_grad():
        mean, std = reference_softmax_diversity(layer_inputs(net, task, batch))
    assert std > 0
    assert got["head_l2_distance_mean"] == pytest.approx(mean, rel=1e-10)
    assert got["head_l2_distance_std"] == pytest.approx(std, rel=1e-10)
    # several batches: the distances of all samples pooled per layer (the same batch twice: same numbers)
    assert head_diversity(net, task, [batch, batch]) == pytest.approx(got, rel=1e-10)


def test_head_diversity_runs_on_scaled_heads_and_on_request_only(single_thread):
    """Attention-SH pools each head's keys by its own factor (maps of different widths): the head
    outputs still compare. The run hook measures only when measure.head_diversity is set."""
    cfg, task, net, batch = tiny_lra("attention_sh")
    got = head_diversity(net, task, batch)
    assert got["head_l2_distance_mean"] > 0 and got["head_l2_distance_std"] >= 0
    assert record_head_diversity(cfg, task, net, "cpu") == {}
    task.splits = {"test": [{k: v[i] for k, v in batch.items()} for i in range(3)]}
    on = copy.deepcopy(cfg)
    with open_dict(on):
        on.measure.head_diversity, on.trainer.eval_batch_size = 2, 2
    assert record_head_diversity(on, task, net, "cpu") == pytest.approx(
        head_diversity(net, task, {k: v[:2] for k, v in batch.items()}))
