"""Kernel x {BN, SH} attentions of "A Primal-Dual Framework for Transformers" (papers/003).

One class, :class:`KernelAttention`, composes one kernel function (softmax / linear / sparse,
kernels.py) with the BN and SH modifiers (modifiers.py); the registered names are presets:

    {attention, linear, sparse} x {"", _bn, _sh, _bn_sh}   (plain softmax is "softmax")

Per head group (heads sharing an SH factor f, one kernel call per group):
    keys/values  <- k_proj / v_proj of the input average-pooled by f        (Remark 5, Eqn. 25)
    q, k         <- q - beta*mu, k - beta*mu  (/ std with bn_scale)         (Eqn. 26, 51; 22-23)
    head output  <- kernel(q, k, v)                                         (Eqn. 1 / 27 / 16)
and the heads are concatenated and projected by out_proj (W_O of Eqn. 17/25).

Pooling happens on the input X as Remark 5 says; since the projections are affine and the
masked mean's weights sum to one, k_proj(pool(X)) is computed only for that group's heads.

Cross-attention (queries from X, keys/values from a context C with its own padding mask): the
key set is built from C instead of X, and everything above applies to it unchanged. BN's mu is
the mean of the head's valid context keys, SH pools the context by the head's factor, and the
softmax and linear kernels are defined for any set of keys. The sparse kernel is not: Child et
al.'s patterns pick keys by their offset from the query's own position (neighbours, every l-th
key back), which a second sequence of another length does not share, so sparse refuses a context.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from attnbench.models.attention.base import ProjectedAttention, merge_heads, split_heads
from attnbench.models.attention.kernels import linear_attention, softmax_attention, sparse_attention
from attnbench.models.attention.modifiers import KeySet, batch_normalize, default_sh_factors, masked_average_pool
from attnbench.models.attention.registry import Capabilities, register_attention

PAPER = "Nguyen et al., A Primal-Dual Framework for Transformers and Neural Networks, ICLR 2023 (papers/003)"
KERNELS = ("softmax", "linear", "sparse")
# The plain kernels are the baselines the primal-dual paper builds on: cited by their own papers.
KERNEL_PAPERS = {
    "linear": "Katharopoulos et al., Transformers are RNNs, ICML 2020 (the linear baseline of papers/003 and 004)",
    "sparse": "Child et al., Generating Long Sequences with Sparse Transformers, 2019 (papers/003 Sec. 2.2.2)",
}
# The kernel is invariant to a per-query constant added to its logits (needed by causal BN).
SHIFT_INVARIANT_KERNELS = ("softmax", "sparse")

_BN_OPTIONS = ("beta", "beta_learnable", "bn_scale")
_SH_OPTIONS = ("sh_factors",)
_SPARSE_OPTIONS = ("block_size", "sparse_pattern", "summary_size")


class KernelAttention(ProjectedAttention):
    """Multi-head attention with a chosen kernel, optionally with BN and/or SH (papers/003)."""

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        *,
        kernel: str = "softmax",
        bn: bool = False,
        sh: bool = False,
        dropout: float = 0.0,
        bias: bool = True,
        beta: float | None = None,
        beta_learnable: bool | None = None,
        bn_scale: bool | None = None,
        sh_factors: list[int] | tuple[int, ...] | None = None,
        block_size: int | None = None,
        sparse_pattern: str | None = None,
        summary_size: int | None = None,
        **unused,
    ):
        super().__init__(d_model, n_heads, dropout, bias, **unused)
        if kernel not in KERNELS:
            raise ValueError(f"kernel must be one of {KERNELS}, got {kernel!r}")
        given = {
            "beta": beta, "beta_learnable": beta_learnable, "bn_scale": bn_scale, "sh_factors": sh_factors,
            "block_size": block_size, "sparse_pattern": sparse_pattern, "summary_size": summary_size,
        }
        for names, enabled, what in (
            (_BN_OPTIONS, bn, "BN variants (*_bn, *_bn_sh)"),
            (_SH_OPTIONS, sh, "SH variants (*_sh, *_bn_sh)"),
            (_SPARSE_OPTIONS, kernel == "sparse", "sparse variants"),
        ):
            for name in names:
                if given[name] is not None and not enabled:
                    raise TypeError(f"{type(self).__name__}: option '{name}' applies only to {what}")
        self.kernel_name, self.bn, self.sh = kernel, bn, sh

        # BN: beta weights the key mean (Eqn. 26); learnable beta is Table 11 / B.5.
        self.bn_scale = bool(bn_scale)
        beta = 1.0 if beta is None else float(beta)
        if bn and beta_learnable:
            self.beta = nn.Parameter(torch.tensor(beta))
        else:
            self.beta = beta

        # SH: one pooling factor per head (Eqn. 25, Remark 5).
        if sh:
            factors = list(sh_factors) if sh_factors is not None else default_sh_factors(n_heads)
            if len(factors) != n_heads:
                raise ValueError(
                    f"sh_factors has {len(factors)} entries but n_heads={n_heads}: "
                    "give one downsampling factor per head"
                )
            if any(int(f) != f or f < 1 for f in factors):
                raise ValueError(f"sh_factors must be positive integers, got {factors}")
            factors = [int(f) for f in factors]
        else:
            factors = [1] * n_heads
        self.sh_factors = factors
        self.head_groups = [(f, [h for h in range(n_heads) if factors[h] == f]) for f in sorted(set(factors))]
        order = [h for _, heads in self.head_groups for h in heads]
        self._restore_order = None if order == list(range(n_heads)) else [order.index(h) for h in range(n_heads)]

        # sparse: block size l (stride), pattern, c summary keys per block (Child et al. 2019).
        self.block_size = block_size
        self.sparse_pattern = sparse_pattern or "strided"
        if self.sparse_pattern not in ("strided", "fixed"):
            raise ValueError(f"sparse_pattern must be 'strided' or 'fixed', got {self.sparse_pattern!r}")
        self.summary_size = summary_size  # None: max(1, l // 8), i.e. c = 16 for l = 128 (Child et al.)

        if kernel == "sparse":
            self.cross_unsupported_reason = (
                "Child et al.'s patterns choose keys by their offset from the query's own position "
                "(neighbours, every l-th key back), which a second sequence of another length does not share"
            )
        if bn and kernel not in SHIFT_INVARIANT_KERNELS:
            self.causal_unsupported_reason = (
                "BN recentres keys by the mean of the keys a query may see; causally that mean changes with "
                "the query, which the linear kernel's prefix sums cannot absorb (use a non-causal task)"
            )

    # ------------------------------------------------------------------ pieces

    def _heads(self, t: torch.Tensor, heads: list[int]) -> torch.Tensor:
        """Select heads (dim 1) of a (B, H, ...) tensor; a view when they are contiguous."""
        if heads == list(range(heads[0], heads[-1] + 1)):
            return t[:, heads[0] : heads[-1] + 1]
        return t.index_select(1, torch.tensor(heads, device=t.device))

    def _project(self, x: torch.Tensor, proj: nn.Linear, heads: list[int]) -> torch.Tensor:
        """proj(x) restricted to the output channels of ``heads`` -> (B, G, N, D)."""
        if len(heads) == self.n_heads:
            return split_heads(proj(x), self.n_heads)
        rows = torch.cat([torch.arange(h * self.d_head, (h + 1) * self.d_head) for h in heads]).to(x.device)
        bias = proj.bias.index_select(0, rows) if proj.bias is not None else None
        return split_heads(F.linear(x, proj.weight.index_select(0, rows), bias), len(heads))

    def _keys(self, x: torch.Tensor, mask: torch.Tensor | None, factor: int, heads: list[int]) -> KeySet:
        """Keys/values of one head group from the input pooled by ``factor`` (Remark 5)."""
        if factor == 1:
            pooled, valid, release = x, mask, None
        else:
            pooled, valid, release = masked_average_pool(x, mask, factor)
        k = self._project(pooled, self.k_proj, heads)
        v = self._project(pooled, self.v_proj, heads)
        return KeySet(k=k, v=v, valid=valid, release=release, factor=factor)

    def _kernel(self, q: torch.Tensor, keys: KeySet, causal: bool) -> torch.Tensor:
        p = self.attention_dropout()  # on attention probabilities; the linear kernel has none
        if self.kernel_name == "softmax":
            return softmax_attention(q, keys, causal, p)
        if self.kernel_name == "linear":
            return linear_attention(q, keys, causal)
        return sparse_attention(
            q, keys, causal, p, block_size=self.block_size, pattern=self.sparse_pattern, summary_size=self.summary_size
        )

    # ------------------------------------------------------------------ forward

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None, causal: bool = False,
                context: torch.Tensor | None = None, context_mask: torch.Tensor | None = None) -> torch.Tensor:
        source, key_mask = self.key_source(x, mask, causal, context, context_mask)
        self.check_causal(causal)
        q_all = split_heads(self.q_proj(x), self.n_heads)
        outputs = []
        for factor, heads in self.head_groups:
            q = self._heads(q_all, heads)
            keys = self._keys(source, key_mask, factor, heads)
            if self.bn:
                q, k = batch_normalize(q, keys, self.beta, self.bn_scale, causal)
                keys.k = k
            outputs.append(self._kernel(q, keys, causal))
        out = outputs[0] if len(outputs) == 1 else torch.cat(outputs, dim=1)
        if self._restore_order is not None:
            out = out[:, self._restore_order]
        return self.out_proj(merge_heads(out))


# ---------------------------------------------------------------------------- registry

_SUMMARIES = {
    "softmax": "softmax",
    "linear": "linear (elu+1 feature map, Katharopoulos et al.)",
    "sparse": "sparse (Child et al. strided/fixed patterns)",
}
_EQUATIONS = {
    ("softmax", True, False): "Eqn. 22-23 (bn_scale), Eqn. 26 (beta)",
    ("softmax", False, True): "Eqn. 25, Remark 5",
    ("softmax", True, True): "Eqn. 49-51 (Appendix I)",
    ("linear", False, False): "Sec. 2.2.1, Eqn. 27 with Phi = elu+1",
    ("linear", True, False): "Eqn. 26 with the linear kernel (end of Sec. 2.3)",
    ("linear", False, True): "Eqn. 25 with the linear kernel (end of Sec. 2.3)",
    ("linear", True, True): "Eqn. 51 with the linear kernel",
    ("sparse", False, False): "Sec. 2.2.2, Eqn. 16 (Child et al. 2019)",
    ("sparse", True, False): "Eqn. 16 + Eqn. 26 (Appendix B.4)",
    ("sparse", False, True): "Eqn. 16 + Eqn. 25 (Appendix B.4)",
    ("sparse", True, True): "Eqn. 16 + Eqn. 51 (Appendix B.4)",
}


def _register_family() -> None:
    for kernel, prefix in (("softmax", "attention"), ("linear", "linear"), ("sparse", "sparse")):
        for bn, sh, suffix in ((False, False, ""), (True, False, "_bn"), (False, True, "_sh"), (True, True, "_bn_sh")):
            if kernel == "softmax" and not (bn or sh):
                continue  # plain softmax is registered as "softmax" (softmax.py)
            name = prefix + suffix
            causal = not (bn and kernel not in SHIFT_INVARIANT_KERNELS)
            cross = kernel != "sparse"  # see KernelAttention.cross_unsupported_reason
            modifiers = " + ".join(m for m, on in (("BN", bn), ("SH", sh)) if on)
            register_attention(
                name,
                paper=PAPER if bn or sh else KERNEL_PAPERS[kernel],
                equation=_EQUATIONS[(kernel, bn, sh)],
                capabilities=Capabilities(causal=causal, padding_mask=True, cross=cross),
                summary=f"{_SUMMARIES[kernel]} kernel" + (f" with {modifiers}" if modifiers else ""),
                kernel=kernel,
                bn=bn,
                sh=sh,
            )(KernelAttention)


_register_family()
