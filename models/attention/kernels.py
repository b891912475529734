"""The three kernels of papers/003 Section 2.1-2.2, one function each, over a :class:`KeySet`.

Every kernel maps queries (B, G, N, D) and a key set of Nk keys to (B, G, N, Dv). A query i
may use key j when the key is valid and, under causality, when j has been released to i
(see modifiers.py). Queries that may use no key output zero (no support vector: f(x) = b = 0).

* softmax (Eqn. 1-2 / 25): PyTorch's fused scaled_dot_product_attention; no N x N tensor is
  built in Python (only a boolean mask when padding or SH causality needs one).
* linear (Sec. 2.2.1, Eqn. 27 with Phi = elu + 1, Katharopoulos et al. 2020): sums of
  Phi(k_j) v_j^T; causal use accumulates them over chunks of keys (exclusive prefix sums of
  per-chunk sums + a masked chunk-local term), so nothing is N x N.
* sparse (Sec. 2.2.2, Eqn. 16, Child et al. 2019): softmax restricted to a sparse set M_i of
  keys, computed block-wise (only the attended blocks are formed), see sparse_attention.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from attnbench.models.attention.base import softmax_kernel
from attnbench.models.attention.modifiers import KeySet

LINEAR_CHUNK = 64  # keys per chunk of the causal linear kernel


def visibility_mask(n_queries: int, keys: KeySet, causal: bool) -> torch.Tensor | None:
    """(B|1, 1, Nq, Nk) bool: key valid and (under causality) released to the query."""
    allowed = None if keys.valid is None else keys.valid[:, None, None, :]
    if causal:
        positions = torch.arange(n_queries, device=keys.k.device)
        released = keys.release_times()[:, None, None, :] <= positions[:, None]
        allowed = released if allowed is None else allowed & released
    return allowed


# --------------------------------------------------------------------------- softmax


def softmax_attention(q: torch.Tensor, keys: KeySet, causal: bool, dropout_p: float = 0.0) -> torch.Tensor:
    """softmax(q k^T / sqrt(D)) v over the visible keys (Eqn. 1 / Eqn. 25) via fused SDPA."""
    parts = _query_split(q, keys)
    if parts == 1:
        if keys.release is None:  # full resolution: the plain (causal) softmax path
            return softmax_kernel(q, keys.k, keys.v, keys.valid, causal, dropout_p)
        allowed = visibility_mask(q.shape[2], keys, causal)
        return F.scaled_dot_product_attention(q, keys.k, keys.v, attn_mask=allowed, dropout_p=dropout_p)
    # Few (batch x head) pairs, e.g. one SH head group: split the queries into `parts` chunks
    # folded into the batch, because PyTorch's CPU SDPA backward parallelises over batch x heads
    # only. Each chunk attends to the same keys, so the result is unchanged.
    n = q.shape[2]
    allowed = visibility_mask(n, keys, causal)
    if allowed is not None:
        allowed = allowed.expand(q.shape[0], -1, -1, -1)
        if allowed.shape[2] == 1:
            allowed = _repeat_in_batch(allowed, parts)
        else:
            allowed = _fold_queries(allowed, parts, pad_value=True)
    out = F.scaled_dot_product_attention(
        _fold_queries(q, parts), _repeat_in_batch(keys.k, parts), _repeat_in_batch(keys.v, parts),
        attn_mask=allowed, dropout_p=dropout_p,
    )
    b = q.shape[0]
    out = out.reshape(b, parts, *out.shape[1:]).transpose(1, 2)  # (B, G, parts, m, Dv)
    return out.reshape(b, q.shape[1], -1, out.shape[-1])[:, :, :n]


MIN_QUERIES_PER_SPLIT = 256


def _query_split(q: torch.Tensor, keys: KeySet) -> int:
    """How many query chunks to fold into the batch for a CPU backward pass (1 = none)."""
    needs_grad = torch.is_grad_enabled() and (q.requires_grad or keys.k.requires_grad or keys.v.requires_grad)
    pairs = q.shape[0] * q.shape[1]
    threads = torch.get_num_threads()
    if q.device.type != "cpu" or not needs_grad or pairs >= threads:
        return 1
    return max(1, min(-(-threads // pairs), q.shape[2] // MIN_QUERIES_PER_SPLIT))


def _fold_queries(t: torch.Tensor, parts: int, pad_value=0) -> torch.Tensor:
    """(B, G, N, X) -> (B*parts, G, ceil(N/parts), X): consecutive query chunks become batch rows."""
    b, g, n, x = t.shape
    m = -(-n // parts)
    if m * parts != n:
        t = torch.cat([t, t.new_full((b, g, m * parts - n, x), pad_value)], dim=2)
    return t.view(b, g, parts, m, x).transpose(1, 2).reshape(b * parts, g, m, x)


def _repeat_in_batch(t: torch.Tensor, parts: int) -> torch.Tensor:
    """(B, G, Nk, X) -> (B*parts, G, Nk, X), each batch row repeated for its query chunks."""
    b = t.shape[0]
    return t[:, None].expand(b, parts, *t.shape[1:]).reshape(b * parts, *t.shape[1:])


# --------------------------------------------------------------------------- linear


def elu_feature_map(x: torch.Tensor) -> torch.Tensor:
    """Phi(x) = elu(x) + 1 (Sec. 2.2.1 of papers/003, Katharopoulos et al. 2020)."""
    return F.elu(x) + 1.0


def _ratio(num: torch.Tensor, den: torch.Tensor) -> torch.Tensor:
    """num / den; den = 0 only for a query that sees no key (num = 0 too), whose output is 0.
    Dividing those by 1 rather than by a tiny clamp keeps their gradients finite (a fully padded
    context, or a causal query before its first key); for den > 0 it is the plain division."""
    return num / torch.where(den > 0, den, torch.ones_like(den))[..., None]


def causal_linear_product(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, chunk: int = LINEAR_CHUNK) -> torch.Tensor:
    """out_i = sum_{j <= i} (q_i . k_j) v_j for q, k (B, H, N, D) and v (B, H, N, E).

    The one causal prefix-sum product of the feature-map attentions (cosFormer, Flowformer,
    Performer; a denominator is the same product with a column of ones appended to v).
    The reference codes (cosFormer, Flowformer ``causal_dot_product``) cumsum the N outer products
    k_j v_j^T, an N x D x E tensor per head; here earlier chunks enter through exclusive prefix
    sums of per-chunk sums and the current chunk through a masked chunk x chunk product, so
    memory is O(N (chunk + D E / chunk)). Same sums, different association (float rounding only).
    """
    b, h, n, d = q.shape
    e = v.shape[-1]
    n_chunks = -(-n // chunk)
    pad = n_chunks * chunk - n
    qc = F.pad(q, (0, 0, 0, pad)).view(b, h, n_chunks, chunk, d)
    kc = F.pad(k, (0, 0, 0, pad)).view(b, h, n_chunks, chunk, d)
    vc = F.pad(v, (0, 0, 0, pad)).view(b, h, n_chunks, chunk, e)
    chunk_kv = torch.einsum("bhncd,bhnce->bhnde", kc, vc)
    earlier_kv = chunk_kv.cumsum(2) - chunk_kv
    out = torch.einsum("bhnid,bhnde->bhnie", qc, earlier_kv)
    local = torch.einsum("bhnid,bhnjd->bhnij", qc, kc).tril()
    out = out + local @ vc
    return out.reshape(b, h, n_chunks * chunk, e)[:, :, :n]


def linear_attention(q: torch.Tensor, keys: KeySet, causal: bool, chunk: int = LINEAR_CHUNK) -> torch.Tensor:
    """Eqn. 27: h_i = sum_j Phi(q_i)^T Phi(k_j) v_j / sum_j Phi(q_i)^T Phi(k_j)."""
    phi_q = elu_feature_map(q)
    phi_k = elu_feature_map(keys.k) * keys.key_weights(q.dtype)[:, None, :, None]  # padded keys -> 0
    v = keys.v
    if not causal:
        kv = torch.einsum("bgjd,bgje->bgde", phi_k, v)
        z = phi_k.sum(2)
        num = torch.einsum("bgid,bgde->bgie", phi_q, kv)
        den = torch.einsum("bgid,bgd->bgi", phi_q, z)
        return _ratio(num, den)

    b, g, n, d = q.shape
    n_keys, factor, dv = keys.n_keys, keys.factor, v.shape[-1]
    n_chunks = -(-n_keys // chunk)
    key_pad = n_chunks * chunk - n_keys
    query_pad = n_chunks * chunk * factor - n
    phi_k = F.pad(phi_k, (0, 0, 0, key_pad)).view(b, g, n_chunks, chunk, d)
    v = F.pad(v, (0, 0, 0, key_pad)).view(b, g, n_chunks, chunk, dv)
    phi_q = F.pad(phi_q, (0, 0, 0, query_pad)).view(b, g, n_chunks, chunk * factor, d)

    # Keys of earlier chunks are released to every query of the current chunk
    # (release_j <= (j+1)*factor - 1), so they enter through exclusive prefix sums.
    chunk_kv = torch.einsum("bgncd,bgnce->bgnde", phi_k, v)
    chunk_z = phi_k.sum(3)
    state_kv = chunk_kv.cumsum(2) - chunk_kv
    state_z = chunk_z.cumsum(2) - chunk_z
    num = torch.einsum("bgnid,bgnde->bgnie", phi_q, state_kv)
    den = torch.einsum("bgnid,bgnd->bgni", phi_q, state_z)

    # Keys of the current chunk: chunk x (chunk*factor) scores masked by release time.
    release = F.pad(keys.release_times(), (0, key_pad), value=n_chunks * chunk * factor)
    positions = torch.arange(n_chunks * chunk * factor, device=q.device).view(n_chunks, chunk * factor, 1)
    released = (release.view(-1, n_chunks, 1, chunk) <= positions)[:, None]  # (B|1, 1, nc, Cf, C)
    local = torch.einsum("bgnid,bgnjd->bgnij", phi_q, phi_k) * released
    num = num + local @ v
    den = den + local.sum(-1)
    out = _ratio(num, den)
    return out.reshape(b, g, -1, dv)[:, :, :n]


# --------------------------------------------------------------------------- sparse


def _shift_blocks(x: torch.Tensor, offset: int) -> torch.Tensor:
    """x[..., n, :, :] -> x[..., n + offset, :, :] along the block axis (dim 2), zero outside."""
    nb = x.shape[2]
    padded = F.pad(x, (0, 0, 0, 0, 1, 1))
    return padded[:, :, 1 + offset : 1 + offset + nb]


def sparse_attention(
    q: torch.Tensor,
    keys: KeySet,
    causal: bool,
    dropout_p: float = 0.0,
    block_size: int | None = None,
    pattern: str = "strided",
    summary_size: int | None = None,
) -> torch.Tensor:
    """Softmax attention over the sparse sets M_i of Child et al. (2019) (Eqn. 16, papers/003).

    With block (stride) size l, query i (on the key grid: p = i // factor, p = i without SH):

    strided, causal:        A1 = {j : p - l <= j <= p}                 (previous l keys + itself)
                            A2 = {j <= p : (p - j) mod l = 0}          (every l-th key back)
    strided, bidirectional: A1 = {j : |p - j| <= l},   A2 = {j : (p - j) mod l = 0}
    fixed, causal:          A1 = {j <= p : floor(j/l) = floor(p/l)}    (own block so far)
                            A2 = {j <= p : j mod l >= l - c}           (last c keys of each block)
    fixed, bidirectional:   A1 = {j : floor(j/l) = floor(p/l)},  A2 = {j : j mod l >= l - c}

    M_i = A1 u A2 in one softmax (Child et al.'s "merged head"); each key counted once. Under
    causality a key must moreover be released to query i (without SH: j <= i; with SH: its
    whole pooling window lies at or before i, see modifiers.py), and padded keys never count.
    Computation: A1 as block-local attention (own block, plus the previous/next block for
    strided); A2 gathered, not masked: strided = the keys at the query's in-block offset in the
    other blocks (a column of the (N/l) x l grid), fixed = the c summary keys of the other
    blocks. Cost O(N (l + N/l)) for strided, O(N (l + c N/l)) for fixed -- O(N sqrt N) with
    l ~ sqrt N (the default when block_size is None). c = summary_size, default max(1, l // 8)
    (Child et al. use c in {8, 16, 32} for l in {128, 256}).
    """
    if pattern not in ("strided", "fixed"):
        raise ValueError(f"sparse_pattern must be 'strided' or 'fixed', got {pattern!r}")
    b, g, n, d = q.shape
    n_keys, factor, dv = keys.n_keys, keys.factor, keys.v.shape[-1]
    block_len = block_size or max(1, math.ceil(math.sqrt(n_keys)))  # Child et al.'s l (the shapes below)
    nb = -(-n_keys // block_len)
    n_keys_padded, n_queries_padded = nb * block_len, nb * block_len * factor
    device = q.device
    blocks = _SparseBlocks(
        k=F.pad(keys.k, (0, 0, 0, n_keys_padded - n_keys)).view(b, g, nb, block_len, d),
        v=F.pad(keys.v, (0, 0, 0, n_keys_padded - n_keys)).view(b, g, nb, block_len, dv),
        q=F.pad(q * d**-0.5, (0, 0, 0, n_queries_padded - n)).view(b, g, nb, block_len * factor, d),  # 1/sqrt(D)
        valid=F.pad(keys.valid_mask(), (0, n_keys_padded - n_keys), value=False),  # (B|1, Nkp)
        release=F.pad(keys.release_times(), (0, n_keys_padded - n_keys), value=n_queries_padded),
        query_pos=torch.arange(n_queries_padded, device=device).view(nb, block_len * factor),  # i
        block_ids=torch.arange(nb, device=device), block_len=block_len, factor=factor, causal=causal,
        offsets=((-1, 0) if causal else (-1, 0, 1)) if pattern == "strided" else (0,))
    logits_local, allowed_local, v_local = _sparse_local(blocks, pattern)
    if pattern == "strided":
        logits_far, allowed_far = _sparse_strided_far(blocks)
        v_far = None
    else:
        logits_far, allowed_far, v_far = _sparse_fixed_far(blocks, summary_size)

    # ---- one softmax over M_i = A1 u A2
    n_local = logits_local.shape[-1]
    logits = torch.cat([logits_local, logits_far], dim=-1)
    allowed = torch.cat(
        [allowed_local.expand(-1, -1, block_len * factor, -1), allowed_far.expand(-1, -1, block_len * factor, -1)],
        dim=-1
    )[:, None]  # (B|1, 1, nb, l*f, W)
    # masked keys get exp(min - max) = 0 exactly; rows with no allowed key are zeroed below
    probs = torch.softmax(logits.masked_fill(~allowed, torch.finfo(logits.dtype).min), dim=-1)
    if dropout_p > 0:
        probs = F.dropout(probs, p=dropout_p)
    p_local, p_far = probs[..., :n_local], probs[..., n_local:]
    out = p_local @ v_local
    if pattern == "strided":
        p_far = p_far.reshape(b, g, nb, block_len, factor, nb)
        out = out + torch.einsum("bgnrfm,bgmre->bgnrfe", p_far, blocks.v).reshape(b, g, nb, block_len * factor, dv)
    else:
        out = out + p_far @ v_far[:, :, None]
    out = out * allowed.any(-1, keepdim=True)
    return out.reshape(b, g, n_queries_padded, dv)[:, :, :n]


@dataclass
class _SparseBlocks:
    """Queries, keys and values of sparse_attention cut into nb blocks of l keys (l * factor
    queries), with the keys' validity and release times and the queries' positions."""

    k: torch.Tensor  # (B, G, nb, l, D)
    v: torch.Tensor  # (B, G, nb, l, Dv)
    q: torch.Tensor  # (B, G, nb, l*factor, D), scaled by 1/sqrt(D)
    valid: torch.Tensor  # (B|1, nb*l)
    release: torch.Tensor  # (B|1, nb*l)
    query_pos: torch.Tensor  # (nb, l*factor): i
    block_ids: torch.Tensor  # (nb,)
    block_len: int  # Child et al.'s l
    factor: int
    causal: bool
    offsets: tuple[int, ...]  # the blocks of A1 relative to the query's

    @property
    def grid_pos(self) -> torch.Tensor:
        return self.query_pos // self.factor  # p


def _sparse_local(s: _SparseBlocks, pattern: str):
    """A1, block-local: (logits, allowed, values) over the own block (plus the previous/next one
    for strided)."""
    block_len, device = s.block_len, s.q.device
    n_keys_padded = s.block_ids.numel() * block_len
    k_local = torch.cat([_shift_blocks(s.k, o) for o in s.offsets], dim=3)  # (B,G,nb,w*l,D)
    v_local = torch.cat([_shift_blocks(s.v, o) for o in s.offsets], dim=3)
    j_local = torch.cat([(s.block_ids + o)[:, None] * block_len + torch.arange(block_len, device=device)
                         for o in s.offsets], -1)
    in_range = (j_local >= 0) & (j_local < n_keys_padded)
    j_local = j_local.clamp(0, n_keys_padded - 1)  # (nb, w*l)
    member = in_range[:, None, :]
    if pattern == "strided":
        lag = s.grid_pos[:, :, None] - j_local[:, None, :]
        member = member & ((lag >= 0) & (lag <= block_len) if s.causal else lag.abs() <= block_len)
    allowed_local = member & s.valid[:, j_local][:, :, None, :]  # (B|1, nb, l*f, w*l)
    if s.causal:
        allowed_local = allowed_local & (s.release[:, j_local][:, :, None, :] <= s.query_pos[:, :, None])
    return torch.einsum("bgnqd,bgnkd->bgnqk", s.q, k_local), allowed_local, v_local


def _sparse_strided_far(s: _SparseBlocks):
    """A2 of strided: the keys j = m*l + r at the query's in-block offset r, in blocks m outside
    the local window (a column of the (N/l) x l grid): (logits, allowed)."""
    b, g, nb, block_len, d = s.k.shape
    factor, device, block_ids = s.factor, s.q.device, s.block_ids
    j_far = block_ids[None, :] * block_len + torch.arange(block_len, device=device)[:, None]  # (l, nb_k)
    outside = torch.ones(nb, nb, dtype=torch.bool, device=device)
    for o in s.offsets:
        outside &= (block_ids[None, :] - block_ids[:, None]) != o
    if s.causal:
        outside &= block_ids[None, :] <= block_ids[:, None]
    allowed_far = outside[None, :, None, None, :] & s.valid[:, j_far][:, None, :, None, :]  # (B|1,nb,l,1,nb)
    if s.causal:
        release_far = s.release[:, j_far][:, None, :, None, :]
        allowed_far = allowed_far & (release_far <= s.query_pos.view(nb, block_len, factor)[None, ..., None])
    allowed_far = allowed_far.expand(-1, -1, -1, factor, -1).reshape(-1, nb, block_len * factor, nb)
    q_grid = s.q.view(b, g, nb, block_len, factor, d)
    logits_far = torch.einsum("bgnrfd,bgmrd->bgnrfm", q_grid, s.k).reshape(b, g, nb, block_len * factor, nb)
    return logits_far, allowed_far


def _sparse_fixed_far(s: _SparseBlocks, summary_size: int | None):
    """A2 of fixed: the last c keys (the summary) of every other block: (logits, allowed, values)."""
    b, g, nb, block_len, d = s.k.shape
    dv, device, block_ids = s.v.shape[-1], s.q.device, s.block_ids
    c = max(1, min(summary_size or block_len // 8, block_len))
    j_far = (block_ids[:, None] * block_len
             + torch.arange(block_len - c, block_len, device=device)).reshape(-1)  # (nb*c)
    far_block = j_far // block_len
    outside = far_block[None, :] != block_ids[:, None]
    if s.causal:
        outside &= far_block[None, :] < block_ids[:, None]
    allowed_far = outside[None, :, None, :] & s.valid[:, j_far][:, None, None, :]  # (B|1, nb, 1, nb*c)
    if s.causal:
        allowed_far = allowed_far & (s.release[:, j_far][:, None, None, :] <= s.query_pos[None, :, :, None])
    k_summary = s.k[:, :, :, block_len - c :].reshape(b, g, nb * c, d)
    v_summary = s.v[:, :, :, block_len - c :].reshape(b, g, nb * c, dv)
    return torch.einsum("bgnqd,bgsd->bgnqs", s.q, k_summary), allowed_far, v_summary
