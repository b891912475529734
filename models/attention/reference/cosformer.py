"""Transcription of OpenNLPLab/cosFormer ``cosformer.py`` (``CosformerAttention.forward`` and ``left_product``):
the computation as that code writes it, on a module's weights (any float dtype; the tests
compare in float64, `attnbench bench --against-reference` times it in float32)."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from attnbench.models.attention.reference.common import linear


def code_cosformer(m, x, causal, mask=None, act=F.relu, eps=1e-6):
    """CosformerAttention.forward (query = key = value = x, (L, B, E) layout)."""
    query = x.transpose(0, 1)
    tgt_len, bsz, embed_dim = query.size()
    src_len = tgt_len
    num_heads = m.n_heads
    head_dim = embed_dim // num_heads
    q = act(linear(query, m.q_proj))
    k = act(linear(query, m.k_proj))
    v = linear(query, m.v_proj)
    q = q.contiguous().view(-1, bsz * num_heads, head_dim).transpose(0, 1)
    k = k.contiguous().view(-1, bsz * num_heads, head_dim).transpose(0, 1)
    v = v.contiguous().view(-1, bsz * num_heads, head_dim).transpose(0, 1)
    big_m = max(src_len, tgt_len)
    weight_index = (math.pi / 2 * torch.arange(1, big_m + 1).reshape(1, -1, 1)).to(q)  # get_index
    q_ = torch.cat([q * torch.sin(weight_index[:, :tgt_len, :] / big_m),
                    q * torch.cos(weight_index[:, :tgt_len, :] / big_m)], dim=-1)
    k_ = torch.cat([k * torch.sin(weight_index[:, :src_len, :] / big_m),
                    k * torch.cos(weight_index[:, :src_len, :] / big_m)], dim=-1)
    if mask is not None:  # mlpen LRA style: keys times the mask (the heads of a sample share it)
        k_ = k_ * mask.repeat_interleave(num_heads, 0)[:, :, None].to(k_)
    if causal:
        kv_ = torch.einsum("nld,nlm->nldm", k_, v)
        kv_cum = torch.cumsum(kv_, dim=1)
        qkv = torch.einsum("nld,nldm->nlm", q_, kv_cum)
        k_cum = torch.cumsum(k_, dim=1)
        denom = torch.clamp_min(torch.einsum("nlm,nlm->nl", q_, k_cum), eps)
        attn_output = qkv / denom.unsqueeze(-1)
    else:
        kv_ = torch.einsum("nld,nlm->ndm", k_, v)
        z_ = 1 / torch.clamp_min(torch.einsum("nld,nd->nl", q_, torch.sum(k_, axis=1)), eps)
        attn_output = torch.einsum("nld,ndm,nl->nlm", q_, kv_, z_)
    attn_output = attn_output.transpose(0, 1).contiguous().view(tgt_len, bsz, -1)
    return linear(attn_output, m.out_proj).transpose(0, 1)


def code_left_product(m, x, causal, mask=None, eps=1e-6):
    """CosformerAttention.left_product: weights = q_ k_^T (L x S), causal entries zeroed, rows
    divided by max(row sum, eps); keys of padded positions get zero weight."""
    b, n, _ = x.shape
    h, d = m.n_heads, m.d_head
    q = F.relu(linear(x, m.q_proj)).view(b, n, h, d).transpose(1, 2)
    k = F.relu(linear(x, m.k_proj)).view(b, n, h, d).transpose(1, 2)
    v = linear(x, m.v_proj).view(b, n, h, d).transpose(1, 2)
    i = torch.arange(1, n + 1, dtype=x.dtype)
    reweight = torch.cos(math.pi / 2 * (i[:, None] - i[None, :]) / n)  # cos(pi/2 (i - j) / M)
    weights = (q @ k.transpose(-1, -2)) * reweight
    if causal:
        weights = weights * torch.ones(n, n).tril()
    if mask is not None:
        weights = weights * mask[:, None, None, :]
    weights = weights / torch.clamp_min(weights.sum(-1, keepdim=True), eps)
    out = (weights @ v).transpose(1, 2).reshape(b, n, h * d)
    return linear(out, m.out_proj)
