"""Transcription of mlpen/Nystromformer LRA/code/attention.py ``Attention`` + attention_linformer.py:
the computation as that code writes it, on a module's weights (any float dtype; the tests
compare in float64, `attnbench bench --against-reference` times it in float32)."""
from __future__ import annotations

import math

import torch


def code_attention(m, x, mask):
    """attention.py Attention.forward: W_q/W_k/W_v, split_heads, attn(Q, K, V, mask.float()), ff."""
    b, n, _ = x.shape

    def split_heads(t):  # X.reshape(b, n, num_head, head_dim).transpose(1, 2)
        return t.reshape(b, n, m.n_heads, m.d_head).transpose(1, 2)

    q = split_heads(x @ m.q_proj.weight.T + m.q_proj.bias)
    k = split_heads(x @ m.k_proj.weight.T + m.k_proj.bias)
    v = split_heads(x @ m.v_proj.weight.T + m.v_proj.bias)
    out = code_linformer(q, k, v, mask.to(x.dtype), m.projection, m.d_head)
    out = out.transpose(1, 2).reshape(b, n, m.n_heads * m.d_head)  # combine_heads
    return out @ m.out_proj.weight.T + m.out_proj.bias


def code_linformer(Q, K, V, mask, E, head_dim):
    """attention_linformer.py LinformerAttention.forward."""
    K = torch.matmul(E, K * mask[:, None, :, None])
    V = torch.matmul(E, V * mask[:, None, :, None])
    dot = torch.matmul(Q, torch.transpose(K, -2, -1)) / math.sqrt(head_dim)
    return torch.matmul(torch.softmax(dot, dim=-1), V)
