"""Linformer attention (Wang et al. 2020, "Linformer: Self-Attention with Linear Complexity").

As the LRA code that produced the published numbers computes it (mlpen/Nystromformer
``LRA/code/attention_linformer.py``; PrimalAttention_LRA/*/attentions/attention_linformer.py is
an identical copy): per head h, keys and values are projected along the sequence by one learned
E_h (k x max_len), shared by keys and values (Linformer Sec. 4, "key-value sharing"),

    head_h = softmax( Q_h (E_h K_h)^T / sqrt(d_head) ) (E_h V_h)             (Linformer Eqn. 7)

with E ~ N(0, 0.02^2). Padding: K and V are zeroed at padded positions before the projection
(``K * mask``, ``V * mask``), so padded tokens add nothing to E K and E V; the softmax over the
k projected keys needs no mask. The LRA code pads every sequence to max_len; a shorter input of
length N < max_len uses the first N columns of E, which is exactly the reference's result on the
input right-padded to max_len. N > max_len is an error.

The reference applies no attention dropout (its module has no Dropout), so ``dropout`` is
accepted and unused, as the LRA code ignores ``attention_dropout`` for this variant.

Layer sharing: the reference keeps E in a class attribute, so every Linformer layer of a model
uses ONE E (Linformer Sec. 4, "layerwise sharing"). Modules built one per layer each own an E;
``share_projection_across_layers`` ties them to the first layer's, which makes a model's
parameters (and gradients) those of the reference.
"""
from __future__ import annotations

import math
from collections.abc import Iterable

import torch
import torch.nn as nn

from attnbench.models.attention.base import ProjectedAttention
from attnbench.models.attention.registry import Capabilities, register_attention

PAPER = "Wang et al., Linformer: Self-Attention with Linear Complexity, 2020 (LRA code: mlpen/Nystromformer)"
PROJECTION_INIT_STD = 0.02  # attention_linformer.py: torch.nn.init.normal_(..., std = 0.02)


@register_attention(
    "linformer",
    paper=PAPER,
    equation="Eqn. 7 (key-value sharing, Sec. 4)",
    # E mixes all positions of one sequence of at most max_len tokens: not causal, no cross,
    # shorter inputs use E's first columns, longer ones are refused.
    capabilities=Capabilities(padding_mask=True, variable_length=False, sized_by_max_len=True),
    summary="Linformer: keys and values projected along the sequence to k rows by a learned E (needs max_len)",
)
class LinformerAttention(ProjectedAttention):
    """softmax(Q (E K)^T / sqrt(d)) (E V) per head, E of shape (heads, k, max_len) (Linformer Eqn. 7)."""

    causal_unsupported_reason = (
        "E mixes every position of the sequence into each projected key and value, so any output "
        "would see future tokens (the Linformer paper and its LRA code are bidirectional only)"
    )
    cross_unsupported_reason = (
        "E is sized by the length of the sequence it projects (max_len), which a context of its own "
        "length does not share"
    )

    def __init__(self, d_model: int, n_heads: int, *, linformer_k: int = 256, max_len: int | None = None,
                 share_across_layers: bool = True, dropout: float = 0.0, bias: bool = True, **unused):
        super().__init__(d_model, n_heads, dropout, bias, **unused)
        self.share_across_layers = bool(share_across_layers)
        if max_len is None:
            raise ValueError("linformer projects along the sequence: pass max_len (the task's sequence length)")
        if linformer_k < 1 or max_len < 1:
            raise ValueError(f"linformer_k and max_len must be positive, got {linformer_k}, {max_len}")
        self.linformer_k, self.max_len = int(linformer_k), int(max_len)
        self.projection = nn.Parameter(torch.empty(n_heads, self.linformer_k, self.max_len))  # E
        nn.init.normal_(self.projection, std=PROJECTION_INIT_STD)

    def kernel(self, q, k, v, mask, causal):
        n = k.shape[2]
        if n > self.max_len:
            raise ValueError(f"linformer's E covers max_len={self.max_len} positions; got length {n}")
        if mask is not None:  # attention_linformer.py: K * mask, V * mask before projecting
            keep = mask[:, None, :, None].to(k.dtype)
            k, v = k * keep, v * keep
        e = self.projection[:, :, :n]  # first n columns = right-padding to max_len with zeros
        k_projected = torch.einsum("hkn,bhnd->bhkd", e, k)
        v_projected = torch.einsum("hkn,bhnd->bhkd", e, v)
        scores = (q @ k_projected.transpose(-1, -2)).div_(math.sqrt(q.shape[-1]))  # in place: N x k, not kept by autograd
        return torch.softmax(scores, dim=-1) @ v_projected

    @staticmethod
    def tie_layers(modules: Iterable[nn.Module]) -> None:
        """Called by models.roles once a stack's layers are built: one E for the layers that share it."""
        share_projection_across_layers([m for m in modules if isinstance(m, LinformerAttention) and m.share_across_layers])

    def extra_repr(self) -> str:
        return f"linformer_k={self.linformer_k}, max_len={self.max_len}"


def share_projection_across_layers(attentions: Iterable[nn.Module]) -> None:
    """Make every Linformer layer in ``attentions`` use the first one's E, as the reference's
    class-level ``LinformerAttention.projection_matrix`` does (attention_linformer.py:7, 17-22):
    one (heads, k, max_len) parameter per model, whatever the number of layers."""
    layers = [m for m in attentions if isinstance(m, LinformerAttention)]
    for layer in layers[1:]:
        if layer.projection.shape != layers[0].projection.shape:
            raise ValueError(f"cannot share E of shape {tuple(layers[0].projection.shape)} with a layer "
                             f"whose E is {tuple(layer.projection.shape)}")
        layer.projection = layers[0].projection
