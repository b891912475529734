"""Transcription of transformers 3.x ``LongformerSelfAttention`` as mlpen/YOSO attention_longformer.py runs it,
written with loops (one query at a time):
the computation as that code writes it, on a module's weights (any float dtype; the tests
compare in float64, `attnbench bench --against-reference` times it in float32)."""
from __future__ import annotations

import math

import torch

from attnbench.models.attention.reference.common import linear


def code_longformer(m, x, mask, first_token_view):
    """Reference output (B, N, d_model)."""
    b, n, _ = x.shape
    h, d, w = m.n_heads, m.d_head, m.window_size // 2
    attention_mask = mask.double() - 1  # 0 local, -1 padding
    if first_token_view:
        attention_mask[:, 0] = 1  # global
    q = linear(x, m.q_proj).view(b, n, h, d) / math.sqrt(d)
    k = linear(x, m.k_proj).view(b, n, h, d)
    v = linear(x, m.v_proj).view(b, n, h, d)
    out = torch.zeros(b, n, h, d)
    for bi in range(b):
        global_idx = [j for j in range(n) if attention_mask[bi, j] > 0]
        for hi in range(h):
            for i in range(n):
                if attention_mask[bi, i] < 0:
                    continue  # masked query: probabilities zeroed
                if attention_mask[bi, i] > 0:  # global query: all keys
                    scores = k[bi, :, hi] @ q[bi, i, hi] - 10000.0 * (attention_mask[bi] < 0)
                    out[bi, i, hi] = torch.softmax(scores, 0) @ v[bi, :, hi]
                    continue
                scores, values = [], []
                for g in global_idx:
                    scores.append(q[bi, i, hi] @ k[bi, g, hi])
                    values.append(v[bi, g, hi])
                for j in range(i - w, i + w + 1):
                    if 0 <= j < n:
                        scores.append(q[bi, i, hi] @ k[bi, j, hi] - 10000.0 * (attention_mask[bi, j] != 0))
                        values.append(v[bi, j, hi])
                probs = torch.softmax(torch.stack(scores), 0)
                out[bi, i, hi] = probs @ torch.stack(values)
    return linear(out.reshape(b, n, h * d), m.out_proj)
