"""Transcription of mlpen/YOSO ``YOSOEAttention`` (yoso_v1/yoso.py) and its ``Cumulation`` autograd function
(yoso_v1/kernel.py) inside the LRA ``Attention``:
the computation as that code writes it, on a module's weights (any float dtype; the tests
compare in float64, `attnbench bench --against-reference` times it in float32)."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F


class CodeCumulation(torch.autograd.Function):
    """kernel.Cumulation: expectation (1 - acos(Q K^T) / pi)^tau * masks, times V; approximate backward."""

    @staticmethod
    def forward(ctx, q_mask, k_mask, q, k, v, tau):
        expectation = (1 - torch.acos(torch.matmul(q, k.transpose(-1, -2))) / math.pi) ** tau
        expectation = expectation * q_mask[:, :, None] * k_mask[:, None, :]
        ctx.save_for_backward(expectation, q, k, v)
        ctx.tau = tau
        return torch.matmul(expectation, v)

    @staticmethod
    def backward(ctx, grad):
        expectation, q, k, v = ctx.saved_tensors
        weighted_exp = torch.matmul(grad, v.transpose(-1, -2)) * expectation
        grad_q = torch.matmul(weighted_exp, (ctx.tau / 2) * k)
        grad_k = torch.matmul(weighted_exp.transpose(-1, -2), (ctx.tau / 2) * q)
        grad_v = torch.matmul(expectation.transpose(-1, -2), grad)
        return None, None, grad_q, grad_k, grad_v, None


def code_yoso_e(m, x, mask, context=None, context_mask=None, causal=False):
    """Attention.forward (attn_type yoso-v1-e): W_q/W_k/W_v, YOSOEAttention, combine_heads, ff.
    ``context``: keys and values from another sequence; ``causal``: expectation zeroed for j > i."""
    h, d = m.n_heads, m.d_head
    source = x if context is None else context
    source_mask = mask if context is None else context_mask

    def split(t):
        return t.reshape(t.size(0), t.size(1), h, d).transpose(1, 2)

    q = split(x @ m.q_proj.weight.T + m.q_proj.bias)
    k = split(source @ m.k_proj.weight.T + m.k_proj.bias)
    v = split(source @ m.v_proj.weight.T + m.v_proj.bias)
    b, _, n, _ = q.shape
    n_k = k.shape[2]
    if m.conv_window is not None:
        conv_v = F.conv2d(v * source_mask[:, None, :, None], m.conv.weight, padding=(m.conv_window // 2, 0), groups=h)
    q_mask = mask.to(x.dtype)[:, None, :].repeat(1, h, 1).reshape(b * h, n)
    k_mask = source_mask.to(x.dtype)[:, None, :].repeat(1, h, 1).reshape(b * h, n_k)
    q, k, v = (t.reshape(b * h, -1, d) for t in (q, k, v))
    q, k = F.normalize(q, p=2, dim=-1), F.normalize(k, p=2, dim=-1)
    if causal:  # the masking the causal form adds: E_ij = 0 for j > i
        out = torch.stack([CodeCumulation.apply(q_mask[:, i:i + 1], k_mask[:, :i + 1], q[:, i:i + 1], k[:, :i + 1],
                                                v[:, :i + 1], m.hash_code_len) for i in range(n)], 1)[:, :, 0]
    else:
        out = CodeCumulation.apply(q_mask, k_mask, q, k, v, m.hash_code_len)
    out = F.normalize(out, p=2, dim=-1).reshape(b, h, n, d)
    if m.conv_window is not None:
        out = out + conv_v
    out = out.transpose(1, 2).reshape(b, n, h * d)
    return out @ m.out_proj.weight.T + m.out_proj.bias
