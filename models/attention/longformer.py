"""Longformer attention (Beltagy et al. 2020, "Longformer: The Long-Document Transformer", Sec. 3.1):
sliding-window attention plus a few tokens with global attention, as the YOSO LRA code runs it.

Reference: mlpen/YOSO ``encoders/backbones/efficient_attentions/attention_longformer.py``, the code
behind the YOSO paper's LRA "Longformer" row that the Primal-Attention paper (Table 3) reprints;
mlpen/Nystromformer's and the PrimalAttention repo's LRA ``attention.py`` route a ``longformer``
type in ``forward`` but ship no Longformer module. It wraps HuggingFace transformers'
``LongformerSelfAttention`` (``transformers/modeling_longformer.py``, 3.x) and ties its six
projections to the LRA Attention's W_q, W_k, W_v (weights and biases: ``query`` and
``query_global`` are both W_q, etc.); the output goes through the LRA Attention's ``ff`` (W_o).
Options there: ``window_size`` (transformers' ``attention_window``: the *total* window, even;
each token sees ``window_size // 2`` tokens on each side and itself) and ``first_token_view``
(token 0 gets global attention). The YOSO efficiency scripts set window_size 128 and
first_token_view True (efficiency/profile_seq_len_*.py:36). transformers 3.x has no dilation.

For every head, with w = window_size // 2, G = the global tokens (the first ``global_tokens``
positions that are real tokens) and q scaled by 1/sqrt(d):

* a non-global query i: softmax over keys {j : |i - j| <= w} u G (each key once), then the
  values; padded keys never count;
* a global query g: softmax over all real keys (it sees, and is seen by, every token);
* padded queries output 0 (transformers zeroes their probabilities).

The window is computed block-wise (blocks of w queries attend to their own and the two
neighbouring key blocks), so no N x N tensor is built: the scores are N x 3w plus N x |G|, and
global queries use the fused softmax kernel over the N keys.

Causal form: the same pattern restricted to keys j <= i (a window of w past tokens and itself,
and the global tokens that come before i; a global token attends to its own past only).

transformers computes the softmax in float32 even for float64 inputs; otherwise this agrees with
3.3.1's LongformerSelfAttention to ~1e-16 in float64 (checked offline), and exactly in float32.

Departure from the reference: transformers marks token 0 global even when it is padding (the
wrapper sets ``mask[:, 0] = 1``); here only real tokens are global, so padded content never
reaches real outputs. Inputs in the LRA code are right-padded, where the two agree.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from attnbench.models.attention.base import ProjectedAttention, softmax_kernel
from attnbench.models.attention.registry import Capabilities, register_attention

PAPER = "Beltagy et al. 2020, Longformer: The Long-Document Transformer"


def _shift_blocks(x: torch.Tensor, offset: int) -> torch.Tensor:
    """Block axis (dim 2) shifted so block n holds block n + offset; zeros outside."""
    nb = x.shape[2]
    padded = F.pad(x, (0, 0, 0, 0, 1, 1))
    return padded[:, :, 1 + offset:1 + offset + nb]


def sliding_window_attention(q, k, v, valid, n_global, window, causal, dropout_p=0.0):
    """Longformer's attention for non-global queries (see the module docstring).

    q, k, v (B, H, N, d) with q already scaled; valid (B, N) bool (real tokens); the first
    ``n_global`` positions are global where valid; ``window`` = w, the one-sided window."""
    b, h, n, d = q.shape
    w = window
    nb = -(-n // w)
    padded = nb * w
    device = q.device
    is_global = torch.zeros(n, dtype=torch.bool, device=device)
    is_global[:n_global] = True
    # windowed keys: real and not global (global keys enter once, through their own columns)
    window_key = F.pad(valid & ~is_global, (0, padded - n), value=False)  # (B, P)

    def blocks(t):
        return F.pad(t, (0, 0, 0, padded - n)).view(b, h, nb, w, d)

    offsets = (-1, 0) if causal else (-1, 0, 1)
    k_blocks, v_blocks = blocks(k), blocks(v)
    k_local = torch.cat([_shift_blocks(k_blocks, o) for o in offsets], dim=3)  # (B, H, nb, len(offsets) w, d)
    v_local = torch.cat([_shift_blocks(v_blocks, o) for o in offsets], dim=3)
    block_ids = torch.arange(nb, device=device)
    query_pos = torch.arange(padded, device=device).view(nb, w)
    key_pos = torch.cat([(block_ids + o)[:, None] * w + torch.arange(w, device=device) for o in offsets], -1)
    lag = query_pos[:, :, None] - key_pos[:, None, :]  # i - j
    in_range = ((key_pos >= 0) & (key_pos < padded))[:, None, :]
    in_window = (lag <= w) & (lag >= (0 if causal else -w)) & in_range  # causal: the w past tokens and itself
    allowed_local = in_window & window_key[:, key_pos.clamp(0, padded - 1)][:, :, None, :]  # (B, nb, w, W)
    scores_local = torch.einsum("bhnqd,bhnkd->bhnqk", blocks(q), k_local)

    g = min(n_global, n)
    global_pos = torch.arange(g, device=device)
    allowed_global = valid[:, None, :g].expand(b, padded, g)  # (B, P, G)
    if causal:
        allowed_global = allowed_global & (global_pos <= torch.arange(padded, device=device)[:, None])
    scores_global = torch.einsum("bhqd,bhkd->bhqk", blocks(q).view(b, h, padded, d), k[:, :, :g])

    scores = torch.cat([scores_global.view(b, h, nb, w, g), scores_local], dim=-1)
    allowed = torch.cat([allowed_global.view(b, nb, w, g), allowed_local], dim=-1)[:, None]
    # the mask in place in the concatenated scores, which autograd does not keep
    probs = torch.softmax(scores.masked_fill_(~allowed, torch.finfo(scores.dtype).min), dim=-1)
    if dropout_p > 0:
        probs = F.dropout(probs, p=dropout_p)
    out = probs[..., g:] @ v_local + probs[..., :g] @ v[:, :, :g].unsqueeze(2)
    out = out * allowed.any(-1, keepdim=True)  # a query with no key at all outputs 0
    out = out.reshape(b, h, padded, d)[:, :, :n]
    return out * valid[:, None, :, None]  # padded queries output 0, as transformers zeroes their probabilities


class LongformerAttention(ProjectedAttention):
    """Sliding-window attention (window_size // 2 on each side) plus global first tokens (Longformer)."""

    cross_unsupported_reason = (
        "the sliding window pairs query i with the keys around position i of the same sequence "
        "(Beltagy et al. Sec. 3.1); a context has no such positions"
    )

    def __init__(self, d_model: int, n_heads: int, *, window_size: int = 128, global_tokens: int = 1,
                 dropout: float = 0.1, bias: bool = True, **unused):
        super().__init__(d_model, n_heads, dropout, bias, **unused)
        if window_size < 2 or window_size % 2:
            raise ValueError(f"longformer: window_size (total window, as transformers' attention_window) "
                             f"must be even and >= 2, got {window_size}")
        if global_tokens < 0:
            raise ValueError(f"longformer: global_tokens must be >= 0, got {global_tokens}")
        self.window_size = window_size
        self.global_tokens = global_tokens

    def extra_repr(self) -> str:
        return f"window_size={self.window_size}, global_tokens={self.global_tokens}"

    def kernel(self, q, k, v, mask, causal):
        b, h, n, d = q.shape
        valid = torch.ones(b, n, dtype=torch.bool, device=q.device) if mask is None else mask.bool()
        p = self.attention_dropout()
        out = sliding_window_attention(q * d**-0.5, k, v, valid, self.global_tokens, self.window_size // 2,
                                       causal, p)
        g = min(self.global_tokens, n)
        if g:  # global queries attend to every real key (transformers' query_global/key_global/value_global)
            attended = softmax_kernel(q[:, :, :g], k, v, valid, causal, dropout_p=p)
            out = torch.cat([torch.where(valid[:, None, :g, None], attended, out[:, :, :g]), out[:, :, g:]], dim=2)
        return out


register_attention(
    "longformer",
    paper=PAPER,
    equation="Sec. 3.1 (sliding window + global attention)",
    capabilities=Capabilities(causal=True, padding_mask=True, variable_length=True, cross=False),
)(LongformerAttention)
