"""Standard / Optimised / Efficient / Super attention (Hosseini & Hosseini, papers/002, Section 3).

One class; the registered names are presets of which projections exist:

    standard   O = (H_1..H_h) W^O, H_i = S_i V W_i^V, S_i = softmax(Q W_i^Q (K W_i^K)^T / sqrt(d_k))  Eqn. 1-6
    optimised  no W^V: H_i = S_i V_i, V_i = columns (i-1)d_v+1..i d_v of the input             Eqn. 8-12
    efficient  no W^V, no W^K: S_i = softmax(Q W_i^Q K_i^T / sqrt(d_k)), K_i, V_i input column blocks  Eqn. 13-16
    super      efficient + alignment kernel W^A (l x l, with a bias, shared by all heads):
               H_i = S_i (W^A V_i)                                                               Eqn. 19-23

Self-attention: Q = K = V = X (the layer input). Every projection is an nn.Linear with bias,
so per layer: standard 4(d^2+d), optimised 3(d^2+d), efficient 2(d^2+d), super 2(d^2+d) + l^2 + l.

Cross-attention (the decoder of papers/002's translation model, Sec. 4 / Appendix B.4.2, built on
keras-io's neural_machine_translation_with_transformer.py): Q = X, K = V = C, the encoded source.
Every definition above holds with K, V of the context's length: Optimised takes its values,
Efficient its keys and values, as column blocks of C. Super cannot (see below).

Super details. ``align`` = nn.Linear(l, l) acting on the token axis: (W^A V)[t] = sum_s W^A[t, s]
V[s] + b[t]. Padded tokens' values are zeroed before W^A so they cannot leak into real tokens.
``causal=True`` uses W^A masked to its lower triangle (Sec. 3.3), so token t only mixes values
s <= t. The context length is fixed to l = max_len; a shorter input of length N < l uses the
leading N x N block of W^A and the first N biases, which is exactly the result of right-padding
it to l with masked (zeroed) tokens. N > l is an error. No cross-attention: W^A mixes the value
positions of one sequence of fixed length l, and a source of variable length has no such l
(papers/002 leaves Super out of its translation experiment, Table 3).
"""
from __future__ import annotations

import torch
import torch.nn as nn

from attnbench.models.attention.base import AttentionBase, merge_heads, softmax_kernel, split_heads
from attnbench.models.attention.registry import Capabilities, register_attention
from attnbench.models.attention.softmax import SoftmaxAttention

PAPER = "Hosseini & Hosseini, You Need to Pay Better Attention (papers/002)"


class BetterAttention(AttentionBase):
    """Softmax attention whose key/value projections may be replaced by slicing the input (papers/002)."""

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        *,
        project_keys: bool = True,
        project_values: bool = True,
        align: bool = False,
        max_len: int | None = None,
        dropout: float = 0.0,
        bias: bool = True,
        **unused,
    ):
        super().__init__(d_model, n_heads, dropout, bias, **unused)
        if align and max_len is None:
            raise ValueError("super attention needs the fixed context length: pass max_len=l")
        if not align and max_len is not None:
            raise TypeError(f"{type(self).__name__}: option 'max_len' applies only to super attention")
        self.q_proj = nn.Linear(d_model, d_model, bias=bias)  # W^Q (all heads)
        if project_keys:
            self.k_proj = nn.Linear(d_model, d_model, bias=bias)  # W^K
        if project_values:
            self.v_proj = nn.Linear(d_model, d_model, bias=bias)  # W^V
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)  # W^O
        self.max_len = max_len
        if align:
            self.align = nn.Linear(max_len, max_len, bias=True)  # W^A (Eqn. 22)
            self.cross_unsupported_reason = (
                "W^A is tied to one fixed length l, but a context has its own, variable length "
                "(papers/002 leaves Super Attention out of its translation model, Sec. 4)"
            )

    def _aligned_values(self, v: torch.Tensor, mask: torch.Tensor | None, causal: bool) -> torch.Tensor:
        """V'_i = W^A V_i (Eqn. 22) for every head at once; v is (B, H, N, d_v)."""
        n = v.shape[2]
        if n > self.max_len:
            raise ValueError(f"super attention has a fixed context length l={self.max_len}; got length {n}")
        if mask is not None:
            v = v * mask[:, None, :, None].to(v.dtype)
        weight = self.align.weight[:n, :n]
        if causal:
            weight = weight.tril()
        return torch.einsum("ts,bhsd->bhtd", weight, v) + self.align.bias[:n, None]

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None, causal: bool = False,
                context: torch.Tensor | None = None, context_mask: torch.Tensor | None = None) -> torch.Tensor:
        source, key_mask = self.key_source(x, mask, causal, context, context_mask)  # K = V = X, or the context
        h = self.n_heads
        q = split_heads(self.q_proj(x), h)  # Q W_i^Q
        k = split_heads(self.k_proj(source) if hasattr(self, "k_proj") else source, h)  # K W_i^K or K_i
        v = split_heads(self.v_proj(source) if hasattr(self, "v_proj") else source, h)  # V W_i^V or V_i
        if hasattr(self, "align"):
            v = self._aligned_values(v, key_mask, causal)
        out = softmax_kernel(q, k, v, key_mask, causal, self.attention_dropout())  # S_i V'_i
        return self.out_proj(merge_heads(out))


# "standard" is the baseline softmax attention under the name papers/002 uses (Def. 1).
register_attention(
    "standard",
    paper=PAPER,
    equation="Def. 1, Eqn. 1-6",
    capabilities=Capabilities(causal=True, padding_mask=True, cross=True),  # plain cross-attention: K, V from the context
    summary="standard multi-head scaled dot-product attention (same computation as softmax)",
)(SoftmaxAttention)

register_attention(
    "optimised",
    paper=PAPER,
    equation="Def. 2, Eqn. 8-12",
    capabilities=Capabilities(causal=True, padding_mask=True, cross=True),  # values = column blocks of the context
    summary="no W^V: head i uses input column block i as its values",
    project_values=False,
)(BetterAttention)

register_attention(
    "efficient",
    paper=PAPER,
    equation="Def. 3, Eqn. 13-16",
    capabilities=Capabilities(causal=True, padding_mask=True, cross=True),  # keys and values = column blocks of the context
    summary="no W^V, no W^K: head i uses input column block i as keys and values",
    project_keys=False,
    project_values=False,
)(BetterAttention)

register_attention(
    "super",
    paper=PAPER,
    equation="Def. 4, Eqn. 19-23",
    capabilities=Capabilities(causal=True, padding_mask=True, variable_length=False),
    summary="efficient + shared l x l alignment kernel W^A on the values (needs max_len)",
    project_keys=False,
    project_values=False,
    align=True,
)(BetterAttention)
