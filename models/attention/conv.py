"""Attention-Conv1D / Attention-Conv2D (papers/003 Appendix H Def. 4 Eqn. 45, Appendix G Def. 3 Eqn. 43).

    h_i = sum_j softmax( Conv(Q, s)(i)^T Conv(K, s)(j) / sqrt(D) ) v_j

What is convolved: Eqn. 37 motivates the construction with a convolution of the input X, but
the definitions the experiments implement (Def. 3, Eqn. 43; Def. 4, Eqn. 45) convolve the
*query and key matrices* Q = X W_Q, K = X W_K; values are not convolved. We follow Eqn. 43/45.

The convolution is depth-wise with identical kernel channels: one s (1D) or s_h x s_w (2D)
kernel applied to every channel of every head. It is one kernel shared by queries and keys,
since Eqn. 37/43 apply the same Conv(., s) to the test inputs (queries) and the training
inputs (keys). No bias (Eqn. 43 has none); PyTorch's default Conv init.

Boundaries: zero padding to keep the length, (s-1)//2 before and the rest after (so an even
kernel such as the (2, 2) of ImageNet pads one after); padded tokens are zeroed before the
convolution, so a right-padded sequence gives the same outputs as the unpadded one.
Causal Conv1D pads s-1 before and none after, so q_i, k_j only mix positions <= i, j.
Conv2D: tokens are laid out row-major on the patch grid, given as ``grid=(H, W)`` or inferred
as a square; with a cls token (length H*W + 1, assumed first) the cls token's query and key
are left unconvolved. Conv2D cannot be causal.

Cross-attention (queries from x, keys/values from a context): Eqn. 45 holds as it is with the
queries convolved along x and the keys along the context, each with its own padding zeroed, so
Conv1D supports it. The queries of a cross-attention come from a decoder, whose position i must
not see later targets, so they are convolved causally (s-1 before); the keys see the whole
context with the centred kernel. Conv2D does not: it needs the patch grid of both sequences, and one
``grid`` describes one layout (a decoder's queries and an encoded source share none).
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from attnbench.models.attention.base import ProjectedAttention, merge_heads, softmax_kernel, split_heads
from attnbench.models.attention.primal_dual import PAPER
from attnbench.models.attention.registry import Capabilities, register_attention


def _same_padding(size: int) -> tuple[int, int]:
    before = (size - 1) // 2
    return before, size - 1 - before


class ConvolvedQueryKeyAttention(ProjectedAttention):
    """Softmax attention on depth-wise convolved queries and keys; subclasses choose the convolution."""

    def convolve(self, t: torch.Tensor, causal: bool) -> torch.Tensor:
        raise NotImplementedError

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None, causal: bool = False,
                context: torch.Tensor | None = None, context_mask: torch.Tensor | None = None) -> torch.Tensor:
        source, key_mask = self.key_source(x, mask, causal, context, context_mask)
        self.check_causal(causal)
        q, k = self.q_proj(x), self.k_proj(source)
        # padded tokens act like the convolution's zero padding (queries along x, keys along the source)
        if mask is not None:
            q = q * mask[..., None].to(q.dtype)
        if key_mask is not None:
            k = k * key_mask[..., None].to(k.dtype)
        # Eqn. 43 / 45; a cross-attention's queries are a decoder's: causal along the target
        q, k = self.convolve(q, causal or context is not None), self.convolve(k, causal)
        h = self.n_heads
        out = softmax_kernel(
            split_heads(q, h), split_heads(k, h), split_heads(self.v_proj(source), h), key_mask, causal,
            self.attention_dropout(),
        )
        return self.out_proj(merge_heads(out))


@register_attention(
    "conv1d",
    paper=PAPER,
    equation="Appendix H, Def. 4, Eqn. 45",
    capabilities=Capabilities(causal=True, padding_mask=True, cross=True),  # Eqn. 45 with Q convolved along x, K along the context
    summary="softmax attention on queries/keys convolved along the sequence (shared depth-wise kernel)",
)
class Conv1dAttention(ConvolvedQueryKeyAttention):
    """Attention-Conv1D: depth-wise 1D convolution of Q and K, kernel size s (5 for LRA, J.2)."""

    def __init__(self, d_model: int, n_heads: int, kernel_size: int = 5, **common):
        super().__init__(d_model, n_heads, **common)
        self.kernel_size = int(kernel_size)
        self.conv = nn.Conv1d(1, 1, self.kernel_size, bias=False)  # one kernel for every channel

    def convolve(self, t: torch.Tensor, causal: bool) -> torch.Tensor:
        channels, s = t.shape[-1], self.kernel_size
        padding = (s - 1, 0) if causal else _same_padding(s)
        t = F.pad(t.transpose(1, 2), padding)
        out = F.conv1d(t, self.conv.weight.expand(channels, 1, s), groups=channels)
        return out.transpose(1, 2).contiguous()  # channels-last again, so SDPA takes its fused path


@register_attention(
    "conv2d",
    paper=PAPER,
    equation="Appendix G, Def. 3, Eqn. 43",
    # No length-dependent parameters: any grid works (square or ``grid``), so variable_length stays True.
    capabilities=Capabilities(padding_mask=True, needs_grid=True),
    summary="softmax attention on queries/keys convolved over the patch grid (shared depth-wise kernel)",
)
class Conv2dAttention(ConvolvedQueryKeyAttention):
    """Attention-Conv2D: depth-wise 2D convolution of Q and K on the patch grid ((2, 2) for ImageNet, J.3)."""

    causal_unsupported_reason = "a 2D convolution over the patch grid mixes in tokens of later rows"
    cross_unsupported_reason = (
        "its one grid option lays out a single patch grid, while queries and a context of another "
        "length would each need their own"
    )

    def __init__(self, d_model: int, n_heads: int, kernel_size=(2, 2), grid=None, **common):
        super().__init__(d_model, n_heads, **common)
        if isinstance(kernel_size, int):
            kernel_size = (kernel_size, kernel_size)
        self.kernel_size = tuple(int(s) for s in kernel_size)
        self.grid = tuple(int(g) for g in grid) if grid is not None else None
        self.conv = nn.Conv2d(1, 1, self.kernel_size, bias=False)  # one kernel for every channel

    def grid_layout(self, n: int) -> tuple[int, int, bool]:
        """(rows, cols, has_cls) for a sequence of n tokens."""
        if self.grid is not None:
            rows, cols = self.grid
            if n in (rows * cols, rows * cols + 1):
                return rows, cols, n == rows * cols + 1
            raise ValueError(f"conv2d: length {n} is neither grid {rows}x{cols} nor grid + cls token")
        for has_cls in (False, True):
            side = math.isqrt(n - has_cls)
            if side > 0 and side * side == n - has_cls:
                return side, side, has_cls
        raise ValueError(f"conv2d: length {n} is not a square patch grid (+ cls); pass grid=(H, W)")

    def convolve(self, t: torch.Tensor, causal: bool) -> torch.Tensor:
        b, n, channels = t.shape
        rows, cols, has_cls = self.grid_layout(n)
        cls, patches = (t[:, :1], t[:, 1:]) if has_cls else (None, t)
        image = patches.transpose(1, 2).reshape(b, channels, rows, cols)
        (top, bottom), (left, right) = _same_padding(self.kernel_size[0]), _same_padding(self.kernel_size[1])
        image = F.pad(image, (left, right, top, bottom))
        weight = self.conv.weight.expand(channels, 1, *self.kernel_size)
        out = F.conv2d(image, weight, groups=channels).reshape(b, channels, rows * cols).transpose(1, 2).contiguous()
        return out if cls is None else torch.cat([cls, out], dim=1)
