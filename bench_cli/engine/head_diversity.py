"""Head diversity: the layer-average mean and standard deviation of L2 distances between attention
heads, the measure of the primal-dual paper's Table 4 (Nguyen et al. 2023, papers/003, Sec. 4 "New
Attentions Helps Reduce Head Redundancy": "the layer-average mean and standard deviation of
distances between heads" of trained LRA Retrieval models; results/paper/primal_dual_2023.csv
``head_l2_distance_mean`` / ``head_l2_distance_std``).

The paper names neither the tensors nor the inputs (there is no code for it in the paper's
appendix), so attnbench fixes them, and this is the definition:

* the tensor of head h of a layer is its output before the output projection, O_h = A_h V_h
  (N x d_head per sample, N the query positions): the one per-head tensor every attention has
  with the same shape in every head. Attention maps are not comparable here: Attention-SH pools
  the keys of each head by its own factor, so its heads' maps have different widths, and the
  linear and Primal attentions form no map at all;
* for every input sample and every unordered pair of heads h < h' of a layer, the distance is
  the Frobenius (L2) norm ||O_h - O_h'|| over the sample's real query positions (padded rows
  left out);
* per layer, the mean and the (population) standard deviation of those distances over all
  samples and pairs; the reported numbers are the averages over the layers of the per-layer
  means and of the per-layer standard deviations ("layer-average");
* inputs: the test split (or its first N samples), the model in eval mode, no gradients. A layer
  run twice per forward (the Retrieval dual encoder) contributes both documents' samples.

Scale: head outputs carry the values' norms, so these distances are not on the paper's scale (its
2-4 on length-4K Retrieval fit distances between softmax maps, whose rows sum to 1); compare the
order of the attentions, not the numbers.

``head_diversity(model, task, batches)`` computes it for any registry attention (each forwards
its concatenated heads through ``out_proj``); ``record_head_diversity(cfg, task, model, device)``
is the run hook behind ``measure.head_diversity`` (true: the test split; N: its first N samples).
"""
from __future__ import annotations

from collections.abc import Iterable
from contextlib import contextmanager

import torch
import torch.nn as nn

COLUMNS = ("head_l2_distance_mean", "head_l2_distance_std")


def attention_layers(model: nn.Module) -> list[nn.Module]:
    """The model's attention layers with concatenated heads going into ``out_proj``, in model order."""
    from attnbench.models.attention.base import AttentionBase

    return [m for m in model.modules() if isinstance(m, AttentionBase) and isinstance(getattr(m, "out_proj", None), nn.Linear)]


def pairwise_head_distances(heads: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """(batch, pairs) L2 distances ||O_h - O_h'|| (h < h') of ``heads`` (batch, heads, N, d) over the
    real positions of ``mask`` (batch, N; True = real). Padded rows are zeroed in both heads, so
    they add nothing to any distance."""
    if mask is not None:
        heads = heads * mask[:, None, :, None].to(heads.dtype)
    flat = heads.flatten(2)  # (batch, heads, N * d)
    distances = torch.cdist(flat, flat, compute_mode="donot_use_mm_for_euclid_dist")
    i, j = torch.triu_indices(heads.shape[1], heads.shape[1], offset=1)
    return distances[:, i, j]


@contextmanager
def captured_head_distances(model: nn.Module):
    """Within the block, every forward of an attention layer adds its per-sample head distances
    to ``found[layer index]`` (a list of (batch, pairs) tensors), through forward pre-hooks on the
    layer (for its query mask) and on its ``out_proj`` (for the concatenated heads)."""
    layers = attention_layers(model)
    found: dict[int, list[torch.Tensor]] = {i: [] for i in range(len(layers))}
    masks: dict[int, torch.Tensor | None] = {}
    handles = []

    def keep_mask(index):
        def hook(module, args, kwargs):
            masks[index] = args[1] if len(args) > 1 else kwargs.get("mask")
        return hook

    def keep_heads(index, n_heads):
        def hook(module, args):
            merged = args[0]  # (batch, N, heads * d): merge_heads of the kernel's output
            heads = merged.view(*merged.shape[:2], n_heads, -1).transpose(1, 2)
            found[index].append(pairwise_head_distances(heads.detach(), masks.get(index)).cpu())
        return hook

    for i, layer in enumerate(layers):
        handles.append(layer.register_forward_pre_hook(keep_mask(i), with_kwargs=True))
        handles.append(layer.out_proj.register_forward_pre_hook(keep_heads(i, int(layer.n_heads))))
    try:
        yield found
    finally:
        for h in handles:
            h.remove()


def summarise(found: dict[int, list[torch.Tensor]]) -> dict[str, float]:
    """Layer-average of the per-layer mean and population std of the distances."""
    means, stds = [], []
    for distances in found.values():
        if not distances:
            continue
        d = torch.cat([x.flatten() for x in distances]).double()
        means.append(d.mean())
        stds.append(d.std(correction=0))
    if not means:
        raise ValueError("head diversity: no attention layer with at least two heads ran")
    return {COLUMNS[0]: float(torch.stack(means).mean()), COLUMNS[1]: float(torch.stack(stds).mean())}


def head_diversity(model: nn.Module, task, batches: dict | Iterable[dict], device=None) -> dict[str, float]:
    """{"head_l2_distance_mean", "head_l2_distance_std"} of ``model`` on ``batches`` (one batch
    dict of ``task`` or an iterable of them), in eval mode without gradients (module docstring)."""
    from bench_cli.core.task import to_device

    if isinstance(batches, dict):
        batches = [batches]
    if not any(int(layer.n_heads) > 1 for layer in attention_layers(model)):
        raise ValueError("head diversity needs attention layers with at least two heads")
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad(), captured_head_distances(model) as found:
            for batch in batches:
                model(**task.model_inputs(to_device(batch, device) if device is not None else batch))
    finally:
        model.train(was_training)
    return summarise(found)


def record_head_diversity(cfg, task, model: nn.Module, device) -> dict[str, float]:
    """The run hook of ``measure.head_diversity``: {} when unset/false; true: the test split; an
    integer N: its first N samples (in batches of ``trainer.eval_batch_size``)."""
    from omegaconf import OmegaConf
    from torch.utils.data import DataLoader, Subset

    wanted = OmegaConf.select(cfg, "measure.head_diversity", default=None)
    if not wanted:
        return {}
    data = task.dataset("test")
    if not isinstance(wanted, bool):
        data = Subset(data, range(min(int(wanted), len(data))))
    loader = DataLoader(data, batch_size=int(cfg.trainer.eval_batch_size), shuffle=False,
                        collate_fn=task.collate("test"))
    return head_diversity(model, task, loader, device)
