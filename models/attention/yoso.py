"""YOSO-E: the expectation form of YOSO attention (Zeng et al. 2021, "You Only Sample (Almost) Once:
Linear Cost Self-Attention Via Bernoulli Sampling", ICML; Sec. 3, Eqn. 6-7 and the YOSO-E rows).

YOSO replaces softmax(q k^T) by a Bernoulli variable B(q, k) = 1[h(q) = h(k)] of a tau-bit
random-hyperplane hash of the L2-normalised q, k; its expectation, which YOSO-E computes exactly, is

    E[B(q, k)] = (1 - arccos(q^ . k^) / pi) ** tau,        q^ = q / |q|, k^ = k / |k|

Reference: mlpen/YOSO ``encoders/backbones/efficient_attentions/yoso/yoso_v1/yoso.py``
(``YOSOEAttention``, attn_type ``yoso-v1-e`` in ``efficient_attention.py``) and
``yoso_v1/kernel.py`` (``Cumulation``), per head:

    X = normalize( (E * m_q m_k^T) V ),   E_ij = (1 - arccos(q^_i . k^_j) / pi) ** tau

with m the padding masks and ``normalize`` the L2 normalisation of every output row (no row sums,
no 1/sqrt(d), no dropout); optionally plus a depthwise convolution of the masked values along the
sequence (``conv_window``, a Conv2d (conv_window x 1) per head without bias). The output goes
through the LRA Attention's ``ff`` (W_o); W_q, W_k, W_v and ``ff`` are nn.Linear with bias.

Gradient: the reference's ``Cumulation.backward`` does not differentiate arccos; it uses
dE/d(q^ . k^) ~= (tau / 2) E (the YOSO paper's approximation, Sec. 3.3), i.e.

    dQ^ = ((dX' V^T) * E) (tau/2) K^,   dK^ = ((dX' V^T) * E)^T (tau/2) Q^,   dV = E^T dX'

(dX' the gradient at E V). ``YosoExpectation`` reproduces that forward and backward; the
normalisations of Q, K and of the output are differentiated by autograd, as in the reference.
Cosines are clamped to [-1, 1] (rounding can push q^ . k^ past 1, where arccos is NaN).

Causal form (exact): E_ij is set to 0 for j > i before the product, so row i mixes values j <= i.
Cross-attention: E needs only a query and a key set, so keys/values may come from a context.
The expectation is computed as an N x M matrix, as in the reference (YOSO-E is YOSO's exact,
quadratic counterpart).
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from attnbench.models.attention.base import ProjectedAttention, depthwise_sequence_conv
from attnbench.models.attention.registry import Capabilities, register_attention

PAPER = "Zeng et al. 2021, You Only Sample (Almost) Once (YOSO-E, expectation of YOSO attention)"


def collision_expectation(q: torch.Tensor, k: torch.Tensor, hash_code_len: int) -> torch.Tensor:
    """(1 - arccos(q . k) / pi) ** tau for unit q (..., N, d), k (..., M, d): P[tau-bit hashes collide].
    Computed in place in the N x M product (no autograd through it: YosoExpectation's backward is
    the reference's surrogate), so the N x M memory is allocated once."""
    weights = q @ k.transpose(-1, -2)
    return weights.clamp_(-1.0, 1.0).acos_().mul_(-1 / math.pi).add_(1.0).pow_(hash_code_len)


class YosoExpectation(torch.autograd.Function):
    """(E * allowed) V with the reference's surrogate gradient dE/dcos = (tau / 2) E (kernel.py Cumulation).
    ``key_mask`` (B, 1, 1, M) or None zeroes padded keys; ``causal`` zeroes E_ij for j > i."""

    @staticmethod
    def forward(ctx, q, k, v, key_mask, causal, hash_code_len, dropout_keep):
        weights = collision_expectation(q, k, hash_code_len)
        if causal:
            weights.tril_()
        if key_mask is not None:
            weights.mul_(key_mask)
        if dropout_keep is not None:
            weights.mul_(dropout_keep)
        ctx.save_for_backward(q, k, v, weights)
        ctx.hash_code_len = hash_code_len
        return weights @ v

    @staticmethod
    def backward(ctx, grad):
        q, k, v, weights = ctx.saved_tensors
        half_tau = ctx.hash_code_len / 2
        weighted = (grad @ v.transpose(-1, -2)).mul_(weights)
        grad_q = weighted @ (half_tau * k)
        grad_k = weighted.transpose(-1, -2) @ (half_tau * q)
        grad_v = weights.transpose(-1, -2) @ grad
        return grad_q, grad_k, grad_v, None, None, None, None


class YosoEAttention(ProjectedAttention):
    """YOSO-E: normalize(E V), E = (1 - arccos(q^ k^T) / pi)^tau on L2-normalised queries and keys."""

    def __init__(self, d_model: int, n_heads: int, *, hash_code_len: int = 9, conv_window: int | None = None,
                 dropout: float = 0.0, bias: bool = True, **unused):
        super().__init__(d_model, n_heads, dropout, bias, **unused)
        if hash_code_len < 1:
            raise ValueError(f"yoso_e: hash_code_len must be >= 1, got {hash_code_len}")
        self.hash_code_len = hash_code_len
        self.conv_window = conv_window
        if conv_window is not None:  # reference: nn.Conv2d(h, h, (w, 1), padding=(w // 2, 0), bias=False, groups=h)
            if conv_window < 1:
                raise ValueError(f"yoso_e: conv_window must be >= 1, got {conv_window}")
            self.conv = nn.Conv2d(n_heads, n_heads, kernel_size=(conv_window, 1), padding=(conv_window // 2, 0),
                                  bias=False, groups=n_heads)
            self.cross_unsupported_reason = ("the value convolution (conv_window) adds values position by "
                                             "position, which a context of another length does not have")

    def extra_repr(self) -> str:
        return f"hash_code_len={self.hash_code_len}, conv_window={self.conv_window}"

    def kernel(self, q, k, v, mask, causal):
        if causal and self.conv_window is not None:
            raise ValueError("yoso_e: the value convolution (conv_window) is centred, so it cannot run causally")
        m = k.shape[2]
        # reference: expectation * Q_mask[:, :, None] * K_mask[:, None, :]; the query mask only zeroes
        # outputs at padded positions, which are never read, so only keys are masked here
        key_mask = None if mask is None else mask[:, None, None, :].to(q.dtype)
        keep = None
        p = self.attention_dropout()
        if p > 0:  # not in the reference (dropout 0): drops expectation weights, scaled by 1 / (1 - p)
            keep = (torch.rand(*q.shape[:3], m, device=q.device) >= p).to(q.dtype) / (1 - p)
        out = YosoExpectation.apply(F.normalize(q, p=2, dim=-1), F.normalize(k, p=2, dim=-1), v, key_mask, causal,
                                    self.hash_code_len, keep)
        out = F.normalize(out, p=2, dim=-1)
        if self.conv_window is not None:
            v_masked = v if mask is None else v * mask[:, None, :, None].to(v.dtype)
            out = out + depthwise_sequence_conv(v_masked, self.conv.weight)
        return out


register_attention(
    "yoso_e",
    paper=PAPER,
    equation="Sec. 3, E[B(q,k)] = (1 - arccos(q.k)/pi)^tau (YOSO-E); output L2-normalised",
    capabilities=Capabilities(causal=True, padding_mask=True, variable_length=True, cross=True),
)(YosoEAttention)
