"""Transcription of transformers 3.3.1 ``LSHSelfAttention`` as mlpen/Nystromformer LRA/code/attention_reformer.py
runs it, written with loops (one query at a time):
the computation as that code writes it, on a module's weights (any float dtype; the tests
compare in float64, `attnbench bench --against-reference` times it in float32)."""
from __future__ import annotations

import math

import torch


def code_num_buckets(length, chunk, max_pos):
    """LSHSelfAttention._set_num_buckets."""
    pow2 = (2 * (length // chunk)).bit_length() - 1
    limit = 2 * max(int((max_pos // chunk) ** 0.5), chunk)
    return [2 ** (pow2 // 2), 2 ** (pow2 - pow2 // 2)] if 2**pow2 > limit else 2**pow2


def code_lsh(m, x, mask, causal, seed, num_buckets=None, max_pos=None):
    """Output of the reference LSH layer + ff on (B, N, d_model) x, one (batch, head) at a time."""
    b, n0, _ = x.shape
    h, d, chunk, rounds = m.n_heads, m.d_head, m.chunk_length, m.num_hashes
    valid = torch.ones(b, n0, dtype=torch.bool) if mask is None else mask.clone()
    n = n0
    if n0 > chunk and n0 % chunk:  # ReformerModel: pad to a multiple of the chunk length, mask the pads
        n = n0 + (-n0) % chunk
        x = torch.cat([x, torch.zeros(b, n - n0, x.shape[-1])], 1)
        valid = torch.cat([valid, torch.zeros(b, n - n0, dtype=torch.bool)], 1)
    qk = (x @ m.q_proj.weight.T).view(b, n, h, d)  # query_key has no bias
    v = (x @ m.v_proj.weight.T).view(b, n, h, d)
    has_padding = not bool(valid.all())  # ReformerModel passes a mask once it pads
    out = torch.zeros(b, n, h, d)
    # keys: _len_and_dim_norm of the shared query-key vectors
    keys = qk / torch.sqrt((qk**2).mean(-1, keepdim=True) + 1e-6) / math.sqrt(d)

    def attend(bi, hi, i, js):
        """(output, logsumexp) of query i over the candidate key positions js."""
        js = torch.tensor(js)
        logits = keys[bi, js, hi] @ qk[bi, i, hi]
        blocked = ~valid[bi, js] | ((js > i) if causal else torch.zeros_like(js, dtype=torch.bool))
        logits = torch.where(blocked, torch.tensor(-1e9), logits)
        logits = torch.where(js == i, torch.tensor(-1e5), logits)
        lse = torch.logsumexp(logits, 0)
        return torch.exp(logits - lse) @ v[bi, js, hi], lse

    if n <= chunk:  # do_standard_self_attention
        for bi in range(b):
            for hi in range(h):
                for i in range(n):
                    out[bi, i, hi] = attend(bi, hi, i, list(range(n)))[0]
    else:
        nb = num_buckets or code_num_buckets(n, chunk, max_pos or n)
        factors = [nb] if isinstance(nb, int) else nb
        torch.manual_seed(seed)
        rotations = torch.randn(h, d, rounds, sum(factors) // 2)
        for bi in range(b):
            for hi in range(h):
                slots = []  # (round, position) in sorted order
                for r in range(rounds):
                    rotated = qk[bi, :, hi] @ rotations[hi, :, r]  # (n, rot/2)
                    bucket, start, base = torch.zeros(n, dtype=torch.long), 0, 1
                    for f in factors:
                        part = rotated[:, start:start + f // 2]
                        start += f // 2
                        bucket += base * torch.cat([part, -part], -1).argmax(-1)
                        base *= f
                    if has_padding:
                        bucket[~valid[bi]] = base  # the extra padding bucket
                    slots += [(r, i) for i in sorted(range(n), key=lambda i: (int(bucket[i]), i))]
                n_chunks = len(slots) // chunk
                results = {}
                for c in range(n_chunks):
                    window = [(c + o) % n_chunks for o in range(-m.chunks_before, m.chunks_after + 1)]
                    js = [slots[w * chunk + t][1] for w in window for t in range(chunk)]
                    for t in range(chunk):
                        r, i = slots[c * chunk + t]
                        results[r, i] = attend(bi, hi, i, js)
                for i in range(n):
                    lses = torch.stack([results[r, i][1] for r in range(rounds)])
                    weights = torch.exp(lses - torch.logsumexp(lses, 0))
                    out[bi, i, hi] = sum(weights[r] * results[r, i][0] for r in range(rounds))
    out = out.reshape(b, n, h * d)[:, :n0]
    return out @ m.out_proj.weight.T + m.out_proj.bias
