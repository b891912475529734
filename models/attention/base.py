"""Shared pieces of the projected multi-head attentions (Vaswani et al., Eqn. 1-3 of papers/003)."""
from __future__ import annotations

from contextlib import contextmanager

import torch
import torch.nn as nn
import torch.nn.functional as F


def split_heads(x: torch.Tensor, n_heads: int) -> torch.Tensor:
    """(batch, length, heads*d) -> (batch, heads, length, d)."""
    b, n, _ = x.shape
    return x.view(b, n, n_heads, -1).transpose(1, 2)


def merge_heads(x: torch.Tensor) -> torch.Tensor:
    """(batch, heads, length, d) -> (batch, length, heads*d)."""
    b, h, n, d = x.shape
    return x.transpose(1, 2).reshape(b, n, h * d)


def sdpa_mask(mask: torch.Tensor | None, causal: bool, n_q: int, n_k: int, device) -> torch.Tensor | None:
    """Boolean SDPA mask (True = may attend) from a key padding mask and/or causality.

    Returns None when neither applies so SDPA can take its fastest path.
    """
    if mask is None and not causal:
        return None
    allowed = None
    if mask is not None:
        allowed = mask[:, None, None, :n_k]  # (B, 1, 1, Nk)
    if causal:
        tri = torch.ones(n_q, n_k, dtype=torch.bool, device=device).tril()
        allowed = tri if allowed is None else allowed & tri
    return allowed


class _DepthwiseSequenceConv(torch.autograd.Function):
    """k shifted multiply-adds accumulated in place, forward and backward (see depthwise_sequence_conv)."""

    @staticmethod
    def forward(ctx, v, weight):
        k = weight.shape[2]
        taps = weight.view(-1, k, 1, 1)  # (H, k, 1, 1)
        padded = F.pad(v, (0, 0, k // 2, k // 2)).contiguous()
        n_out = padded.shape[2] - k + 1
        out = padded[:, :, :n_out] * taps[:, 0]
        for t in range(1, k):
            out.addcmul_(padded[:, :, t:t + n_out], taps[:, t])
        ctx.save_for_backward(padded, weight)
        ctx.length = v.shape[2]
        return out

    @staticmethod
    def backward(ctx, grad):
        padded, weight = ctx.saved_tensors
        b, h, _, d = padded.shape
        k = weight.shape[2]
        taps = weight.view(-1, k, 1, 1)
        grad = grad.contiguous()
        n_out = grad.shape[2]
        grad_v = grad_weight = None
        if ctx.needs_input_grad[0]:
            grad_padded = torch.zeros_like(padded)
            for t in range(k):
                grad_padded[:, :, t:t + n_out].addcmul_(grad, taps[:, t])
            grad_v = grad_padded[:, :, k // 2:k // 2 + ctx.length]
        if ctx.needs_input_grad[1]:  # the correlation of grad with the values, per channel (head, batch, d)
            channels = h * b * d
            values = padded.permute(1, 0, 3, 2).reshape(1, channels, -1)
            filters = grad.permute(1, 0, 3, 2).reshape(channels, 1, n_out)
            grad_weight = F.conv1d(values, filters, groups=channels).view(h, b * d, k).sum(1).view(weight.shape)
        return grad_v, grad_weight


def depthwise_sequence_conv(v: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """What ``nn.Conv2d(H, H, (k, 1), padding=(k // 2, 0), groups=H, bias=False)`` with this ``weight``
    (H, 1, k, 1) computes on values (B, H, N, d): one k-tap filter per head along the sequence (the
    value-convolution skips of Nystromformer, SOFT and YOSO-E). Written as k shifted multiply-adds
    accumulated in place (no temporary per tap, forward or backward), which on the CPU runs several
    times faster than the convolution kernels at this shape (the d channels of a head share a filter)."""
    return _DepthwiseSequenceConv.apply(v, weight)


def softmax_kernel(q, k, v, mask=None, causal=False, dropout_p: float = 0.0, scale=None):
    """softmax(QK^T/sqrt(D)) V through PyTorch's fused kernel (Eqn. 1 of papers/003).

    Queries with no key to attend (e.g. a fully padded causal prefix) get a zero output:
    PyTorch's SDPA uses a safe softmax for fully masked rows.
    """
    if causal and mask is None and q.shape[-2] == k.shape[-2]:
        return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=True, scale=scale)
    attn_mask = sdpa_mask(mask, causal, q.shape[-2], k.shape[-2], q.device)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, scale=scale)


def reject_unknown_options(owner: str, unused: dict) -> None:
    if unused:
        raise TypeError(f"{owner} got unknown options: {', '.join(sorted(unused))}")


class AttentionBase(nn.Module):
    """Common options of every variant: d_model, n_heads, dropout, bias; anything else is a TypeError."""

    # Variants that cannot run causally say why; forward(causal=True) raises this message.
    causal_unsupported_reason: str | None = None
    # Variants that cannot attend to a second sequence say why; forward(context=...) raises it.
    # Keep it in step with the registry's Capabilities.cross (tests/test_attention_cross.py checks).
    cross_unsupported_reason: str | None = None
    # The registry's Capabilities of a module built by name (registry.build_attention): what is
    # not declared there is refused too, so a plugin that declares nothing accepts nothing more.
    declared = None

    def __init__(self, d_model: int, n_heads: int, dropout: float = 0.0, bias: bool = True, **unused):
        super().__init__()
        reject_unknown_options(type(self).__name__, unused)
        if d_model % n_heads:
            raise ValueError(f"d_model={d_model} is not divisible by n_heads={n_heads}")
        self.d_model, self.n_heads, self.d_head = d_model, n_heads, d_model // n_heads
        self.dropout = dropout
        self.bias = bias

    def attention_dropout(self) -> float:
        """Attention-probability dropout rate for the current mode (0 at eval)."""
        return self.dropout if self.training else 0.0

    def check_causal(self, causal: bool) -> None:
        reason = self.causal_unsupported_reason or self._undeclared("causal")
        if causal and reason:
            raise ValueError(f"{type(self).__name__} cannot run causally: {reason}")

    def _undeclared(self, capability: str) -> str | None:
        if self.declared is not None and not getattr(self.declared, capability):
            return f"its registration does not declare {capability} (Capabilities({capability}=True))"
        return None

    def key_source(self, x: torch.Tensor, mask: torch.Tensor | None, causal: bool,
                   context: torch.Tensor | None, context_mask: torch.Tensor | None):
        """The sequence keys and values come from, and its padding mask.

        Self-attention (no context): ``(x, mask)`` itself. Cross-attention: ``(context,
        context_mask)``; queries still come from ``x``, and ``mask`` then only marks padded
        queries, whose outputs are never read. A decoder's causality lives in its
        self-attention: its cross-attention sees the whole encoded source, so causal=True with
        a context is refused rather than given a meaning (query i vs. key i of another sequence).
        """
        name = type(self).__name__
        if context is None:
            if context_mask is not None:
                raise ValueError(f"{name}: context_mask given without a context")
            return x, mask
        if causal:
            raise ValueError(f"{name}: causal=True with a context: cross-attention sees the whole context "
                             "(the causal mask belongs to the decoder's self-attention)")
        reason = self.cross_unsupported_reason or self._undeclared("cross")
        if reason:
            raise ValueError(f"{name} cannot attend to a context (cross-attention): {reason}")
        if context.dim() != 3 or context.shape[0] != x.shape[0] or context.shape[-1] != x.shape[-1]:
            raise ValueError(f"{name}: context must be (batch={x.shape[0]}, length, d_model={x.shape[-1]}), "
                             f"got {tuple(context.shape)}")
        if context_mask is not None and context_mask.shape != context.shape[:2]:
            raise ValueError(f"{name}: context_mask must be {tuple(context.shape[:2])}, got {tuple(context_mask.shape)}")
        return context, context_mask


class ProjectedAttention(AttentionBase):
    """Multi-head attention with q/k/v/out projections; subclasses choose the kernel."""

    def __init__(self, d_model: int, n_heads: int, dropout: float = 0.0, bias: bool = True, **unused):
        super().__init__(d_model, n_heads, dropout, bias, **unused)
        self.q_proj = nn.Linear(d_model, d_model, bias=bias)
        self.k_proj = nn.Linear(d_model, d_model, bias=bias)
        self.v_proj = nn.Linear(d_model, d_model, bias=bias)
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)

    def kernel(self, q, k, v, mask, causal):
        raise NotImplementedError

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None, causal: bool = False,
                context: torch.Tensor | None = None, context_mask: torch.Tensor | None = None) -> torch.Tensor:
        source, key_mask = self.key_source(x, mask, causal, context, context_mask)
        self.check_causal(causal)
        h = self.n_heads
        q = split_heads(self.q_proj(x), h)
        k = split_heads(self.k_proj(source), h)
        v = split_heads(self.v_proj(source), h)
        return self.out_proj(merge_heads(self.kernel(q, k, v, key_mask, causal)))


def collect_auxiliary_loss(model: nn.Module, layers: str = "sum") -> torch.Tensor | None:
    """``auxiliary_loss()`` of every submodule that has one (Primal's KSVD term), combined over
    those layers by ``layers``: ``sum`` (the default) or ``mean`` (the Primal-Attention code's
    ``loss_ksvd / len(score_list)``; model option ``ksvd_layers``).

    The trainer adds ``eta * collect_auxiliary_loss(model, layers)`` to the task loss. Returns None
    when no module contributes (no Primal layer, or no forward pass yet).
    """
    if layers not in ("sum", "mean"):
        raise ValueError(f"auxiliary-loss layers={layers!r} is not one of sum, mean")
    terms = []
    for module in model.modules():
        fn = getattr(module, "auxiliary_loss", None)
        if not callable(fn):
            continue
        term = fn()
        if term is not None:
            terms.append(term)
    if not terms:
        return None
    total = terms[0]
    for term in terms[1:]:
        total = total + term
    return total / len(terms) if layers == "mean" else total


@contextmanager
def accumulate_auxiliary_losses(model: nn.Module):
    """Within the block, every forward pass of ``model``'s auxiliary-loss layers adds to one
    auxiliary loss (averaged over the passes before it is squared) instead of replacing the last.
    For models that run the same layers more than once per forward, e.g. the LRA retrieval dual
    encoder (both documents through one encoder). Outside such a block each layer keeps only its
    latest pass, so no term survives into the next step."""
    layers = [m for m in model.modules() if callable(getattr(m, "accumulate_passes", None))]
    for m in layers:
        m.accumulate_passes(True)
    try:
        yield
    finally:
        for m in layers:
            m.accumulate_passes(False)
