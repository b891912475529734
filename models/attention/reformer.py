"""Reformer's LSH attention (Kitaev et al. 2020, "Reformer: The Efficient Transformer", Sec. 2-3),
as the Primal-Attention / Nystromformer LRA code runs it.

The reference is mlpen/Nystromformer ``LRA/code/attention_reformer.py`` (copied unchanged into
yingyichen-cyy/PrimalAttention ``PrimalAttention_LRA/*/attentions/attention_reformer.py``): a thin
wrapper around HuggingFace transformers' ``LSHSelfAttention`` (transformers 3.3.1, the version the
PrimalAttention LRA README pins; ``transformers/modeling_reformer.py``) built from a default
``ReformerConfig`` with attention_head_size, num_attention_heads, num_hashes (``num_hash``),
is_decoder=False and max_position_embeddings (= max_seq_len) overridden. The config defaults it
relies on are this module's defaults: lsh_attn_chunk_length 64, num_buckets None (chosen from the
sequence length), lsh_num_chunks_before 1 / after 0, hash_seed None (fresh random rotations every
forward pass), lsh_attention_probs_dropout_prob 0.0. We compute the same thing here rather than
depend on transformers (whose 3.x module layout the reference imports is gone); outputs and
gradients were checked against 3.3.1's LSHSelfAttention to ~1e-15 in float64:

* shared QK (Sec. 2.1): queries = keys = x W_q^T, *without* W_q's bias (``query_key`` is a
  bias-free Linear whose weight is tied to the LRA Attention's W_q); values = x W_v^T without bias.
  W_k (weight and bias) and the biases of W_q, W_v exist in the reference's Attention but are
  unused; they are kept here so parameter counts match. The output goes through W_o (``ff``).
* hashing (Eqn. 3, angular LSH): h(x) = argmax([xR; -xR]) with a random R (d x n_buckets/2) per
  head and round, drawn from N(0, 1); n_buckets a list = a factorised hash (buckets multiply).
  Padded tokens go to an extra bucket after all others.
* attention (Eqn. 2-4, Sec. 2 "chunked"): per round, tokens are stably sorted by bucket, cut into
  chunks of ``chunk_length``; each chunk attends to itself and ``chunks_before`` / ``chunks_after``
  neighbouring chunks of the sorted sequence (wrapping around, across rounds). Keys are the
  queries scaled to unit RMS (x / sqrt(mean(x^2) + 1e-6)) and by 1/sqrt(d). A token never attends
  to itself (logit -1e5) unless nothing else is available; padded keys (and, causally, later
  positions) get logit -1e9.
* rounds (Eqn. 4, ``num_hashes``): each round's output o_r and logsumexp z_r are combined as
  sum_r o_r exp(z_r - logsumexp_r z_r).
* sequences no longer than one chunk use plain shared-QK attention over all tokens (same masks).

Lengths that are not a multiple of ``chunk_length`` are right-padded with masked tokens, as
transformers' ``ReformerModel`` pads its input (the LRA inputs are 1024/2048/4096, multiples of 64).

Causal form (``is_decoder=True``): a query attends to positions <= its own, always including
itself. Outputs are sums over those positions only, but for sequences longer than one chunk the
*set* of earlier keys a query shares a chunk with depends on where later tokens hash (sorting),
as in transformers and trax; outputs are strictly independent of later tokens only when
``N <= chunk_length``.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from attnbench.models.attention.base import ProjectedAttention, merge_heads, split_heads
from attnbench.models.attention.registry import Capabilities, register_attention

PAPER = "Kitaev et al. 2020, Reformer: The Efficient Transformer (LSH attention)"


def auto_num_buckets(length: int, chunk_length: int, max_len: int) -> int | list[int]:
    """transformers' ``_set_num_buckets``: about 2 * length / chunk_length buckets, rounded down to a
    power of 2, factorised into two powers of 2 when above 2 * max(sqrt(max_len / chunk), chunk)."""
    power = (2 * (length // chunk_length)).bit_length() - 1
    n_buckets = 2**power
    limit = 2 * max(int((max_len // chunk_length) ** 0.5), chunk_length)
    if n_buckets > limit:
        return [2 ** (power // 2), 2 ** (power - power // 2)]
    return n_buckets


def _look_adjacent(x: torch.Tensor, before: int, after: int) -> torch.Tensor:
    """Chunks (dim 2) joined with their ``before`` preceding and ``after`` following chunks along dim
    3, cyclically (chunk 0 sees the last chunk), as transformers' ``_look_adjacent``."""
    if before == 0 and after == 0:
        return x
    return torch.cat([x if i == 0 else torch.roll(x, -i, dims=2) for i in range(-before, after + 1)], dim=3)


def _rms_normalised(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """x / sqrt(mean(x^2) + eps): transformers' ``_len_norm`` of the shared QK vectors (keys)."""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


class _GatherRows(torch.autograd.Function):
    """x (B, H, L, d) -> its rows ``rows`` of x viewed as (B*H*L, d), shaped (B, H, len(rows) / (B*H), d):
    the sort of tokens into hash slots (each token once per round) and its undoing. ``rows`` is a
    permutation repeated ``copies`` times, so the gradient is a gather too, by the inverse rows
    ``inverse`` then summed over the copies (laid out copy-major per (B, H)), where torch.gather's
    backward scatters with atomic adds into zeros (twice as slow here)."""

    @staticmethod
    def forward(ctx, x, rows, inverse, copies):
        b, h, length, d = x.shape
        ctx.save_for_backward(inverse)
        ctx.copies, ctx.shape = copies, x.shape
        return x.reshape(-1, d).index_select(0, rows).view(b, h, -1, d)

    @staticmethod
    def backward(ctx, grad):
        (inverse,) = ctx.saved_tensors
        b, h, length, d = ctx.shape
        grad = grad.reshape(-1, d).index_select(0, inverse).view(b, h, ctx.copies, length, d)
        return grad.sum(2) if ctx.copies > 1 else grad.squeeze(2), None, None, None


class _MaskedSoftmax(torch.autograd.Function):
    """(softmax, logsumexp) over the last axis of logits masked as transformers masks them: ``blocked``
    (padded or, causally, later keys) -> mask_value, then ``is_self`` -> self_value.

    One function rather than masked_fill + logsumexp + softmax under autograd, which spent more time
    than the rest of the layer: the masks go in place into the product (only this function holds it),
    so nothing is cloned for their backward; the logsumexp is max(s) - log(max(p)) (the softmax is
    1 / sum exp(s - max(s)) at its maximum); and the backward is one expression,
    ds = p * (g_p - sum(g_p p) + g_lse), zero at self positions (a constant there, so no gradient;
    at blocked ones p is exactly 0, as exp(-1e9 - lse) is, the self logit keeping lse >= -1e5)."""

    @staticmethod
    def forward(ctx, dots, blocked, is_self, mask_value, self_value):
        if blocked is not None:
            dots.masked_fill_(blocked, mask_value)
        dots.masked_fill_(is_self, self_value)
        probs = torch.softmax(dots, dim=-1)
        logits = dots.amax(-1) - probs.amax(-1).log()
        ctx.save_for_backward(probs, is_self)
        return probs, logits

    @staticmethod
    def backward(ctx, grad_probs, grad_logits):
        probs, is_self = ctx.saved_tensors
        grad = grad_probs * probs
        grad.addcmul_(probs, grad_logits.unsqueeze(-1) - grad.sum(-1, keepdim=True))
        return grad.masked_fill_(is_self, 0), None, None, None, None


class ReformerAttention(ProjectedAttention):
    """LSH attention with shared QK, hashed into buckets, chunked, several hash rounds (Reformer)."""

    cross_unsupported_reason = (
        "LSH attention shares one projection for queries and keys and hashes them together "
        "(Kitaev et al. Sec. 2.1), which has no meaning for keys from another sequence"
    )

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        *,
        num_hashes: int = 2,
        chunk_length: int = 64,
        num_buckets: int | list[int] | None = None,
        chunks_before: int = 1,
        chunks_after: int = 0,
        hash_seed: int | None = None,
        max_len: int | None = None,
        dropout: float = 0.0,
        bias: bool = True,
        **unused,
    ):
        super().__init__(d_model, n_heads, dropout, bias, **unused)
        # W_q -> query_key (weight only); W_v -> value (weight only); W_k unused (reference ties
        # ``self.query_key.weight = query.weight``, ``self.value.weight = value.weight``).
        if num_hashes < 1 or chunk_length < 1 or chunks_before < 0 or chunks_after < 0:
            raise ValueError("reformer: num_hashes and chunk_length must be >= 1, chunks_before/after >= 0")
        factors = [num_buckets] if isinstance(num_buckets, int) else list(num_buckets or [])
        if any(f < 2 or f % 2 for f in factors):
            raise ValueError(f"reformer: num_buckets must be even (or a list of even factors), got {num_buckets}")
        self.num_hashes = num_hashes
        self.chunk_length = chunk_length
        self.num_buckets = num_buckets if isinstance(num_buckets, int) or num_buckets is None else list(num_buckets)
        self.chunks_before, self.chunks_after = chunks_before, chunks_after
        self.hash_seed = hash_seed
        self.max_len = max_len  # transformers' max_position_embeddings: only bounds the automatic num_buckets

    def extra_repr(self) -> str:
        return (f"num_hashes={self.num_hashes}, chunk_length={self.chunk_length}, num_buckets={self.num_buckets}, "
                f"hash_seed={self.hash_seed}")

    # ------------------------------------------------------------------ hashing

    def random_rotations(self, rotation_size: int, d_head: int, like: torch.Tensor) -> torch.Tensor:
        """R of shape (heads, d_head, num_hashes, rotation_size / 2) ~ N(0, 1).

        hash_seed None: drawn from the global RNG at every call (the reference's default).
        hash_seed s: the reference calls ``torch.manual_seed(s)`` before drawing; a private
        generator seeded with s draws the same numbers without resetting the global RNG."""
        shape = (self.n_heads, d_head, self.num_hashes, rotation_size // 2)
        generator = None
        if self.hash_seed is not None:
            generator = torch.Generator(device=like.device).manual_seed(self.hash_seed)
        return torch.randn(shape, generator=generator, device=like.device, dtype=like.dtype)

    def hash_buckets(self, qk: torch.Tensor, valid: torch.Tensor | None, n_buckets) -> tuple[torch.Tensor, int]:
        """Bucket of every token in every round, (B, H, rounds, N), and the number of buckets per
        round (one more when padded tokens get their own bucket). Angular LSH, Eqn. 3."""
        factors = [n_buckets] if isinstance(n_buckets, int) else n_buckets
        rotations = self.random_rotations(sum(factors), qk.shape[-1], qk)
        rotated = torch.einsum("bhnd,hdrk->bhrnk", qk.detach(), rotations)
        buckets, start, total = None, 0, 1
        for factor in factors:  # a factorised hash: one argmax per factor, combined mixed-radix
            part = rotated[..., start:start + factor // 2]
            start += factor // 2
            index = torch.cat([part, -part], dim=-1).argmax(-1)
            buckets = index if buckets is None else buckets + total * index
            total *= factor
        if valid is not None and not bool(valid.all()):
            buckets = torch.where(valid[:, None, None, :], buckets, torch.full_like(buckets, total))
            total += 1
        return buckets, total

    # ------------------------------------------------------------------ attention

    def _mask_values(self, dtype: torch.dtype) -> tuple[float, float]:
        """(padding / causal logit, self logit): -1e9 / -1e5, or -1e4 / -1e3 in float16 (reference)."""
        return (-1e4, -1e3) if dtype == torch.float16 else (-1e9, -1e5)

    def _attend(self, q, keys, values, q_pos, k_pos, key_valid, causal):
        """Masked softmax of q keys^T over the last axis; returns outputs and logsumexp logits.

        q (..., Lq, d), keys/values (..., Lk, d); q_pos (..., Lq), k_pos (..., Lk) token positions;
        key_valid (..., Lk) bool or None."""
        blocked = None if key_valid is None else ~key_valid[..., None, :]  # broadcast over the queries
        if causal:
            later = q_pos[..., :, None] < k_pos[..., None, :]
            blocked = later if blocked is None else blocked | later
        # no attention to itself unless nothing else is available (Sec. 2.2 "shared-QK")
        is_self = q_pos[..., :, None] == k_pos[..., None, :]
        probs, logits = _MaskedSoftmax.apply(q @ keys.transpose(-1, -2), blocked, is_self,
                                             *self._mask_values(q.dtype))
        probs = F.dropout(probs, p=self.attention_dropout())
        return probs @ values, logits

    def lsh_attention(self, qk: torch.Tensor, v: torch.Tensor, valid: torch.Tensor | None, causal: bool):
        """Multi-round chunked LSH attention over (B, H, N, d) shared query-keys and values."""
        b, h, n, d = qk.shape
        positions = torch.arange(n, device=qk.device)
        key_scale = d**-0.5
        if n <= self.chunk_length:  # one chunk: attention over all tokens (transformers' standard path)
            keys = _rms_normalised(qk) * key_scale
            key_valid = None if valid is None else valid[:, None, :]
            out, _ = self._attend(qk, keys, v, positions, positions, key_valid, causal)
            return out

        n_buckets = self.num_buckets or auto_num_buckets(n, self.chunk_length, self.max_len or n)
        buckets, total = self.hash_buckets(qk, valid, n_buckets)
        rounds = self.num_hashes
        offsets = torch.arange(rounds, device=qk.device)[:, None] * total
        buckets = (buckets + offsets).reshape(b, h, rounds * n)
        # stable sort: within a bucket, tokens keep their order (rounds are kept apart by the offsets)
        order = torch.sort(buckets, dim=-1, stable=True).indices  # (B, H, rounds*N)
        slots = torch.arange(rounds * n, device=qk.device).expand_as(order)
        undo = torch.empty_like(order).scatter_(-1, order, slots)  # the inverse permutation
        token = order % n  # position of each sorted slot
        # row indices into (B*H*N, d) tokens and (B*H*rounds*N, d) slots, for _GatherRows
        heads = torch.arange(b * h, device=qk.device).view(b, h, 1)
        token_rows = (token + heads * n).flatten()
        sorted_rows = (order + heads * (rounds * n)).flatten()  # slot order[s] of each sorted slot s
        unsorted_rows = (undo + heads * (rounds * n)).flatten()  # where each (round, token) was sorted to

        def gather(t):  # (B, H, N, d) -> sorted slots (B, H, rounds*N, d); the gradient sums the rounds
            return _GatherRows.apply(t, token_rows, unsorted_rows, rounds)

        chunk = self.chunk_length
        n_chunks = rounds * n // chunk
        qk_sorted = gather(qk).view(b, h, n_chunks, chunk, d)
        v_sorted = gather(v).view(b, h, n_chunks, chunk, d)
        q_pos = token.view(b, h, n_chunks, chunk)
        before, after = self.chunks_before, self.chunks_after
        keys = _look_adjacent(_rms_normalised(qk_sorted) * key_scale, before, after)
        values = _look_adjacent(v_sorted, before, after)
        k_pos = _look_adjacent(q_pos[..., None], before, after).squeeze(-1)
        key_valid = None
        if valid is not None:
            key_valid = torch.gather(valid[:, None, :].expand(b, h, n), 2, k_pos.flatten(2)).view(k_pos.shape)
        out, logits = self._attend(qk_sorted, keys, values, q_pos, k_pos, key_valid, causal)

        out = _GatherRows.apply(out.reshape(b, h, rounds * n, d), unsorted_rows, sorted_rows, 1)
        logits = _GatherRows.apply(logits.reshape(b, h, rounds * n, 1), unsorted_rows, sorted_rows, 1)
        if rounds == 1:
            return out
        out = out.view(b, h, rounds, n, d)
        logits = logits.view(b, h, rounds, n, 1)
        weights = torch.exp(logits - torch.logsumexp(logits, dim=2, keepdim=True))  # Eqn. 4 over rounds
        return (out * weights).sum(2)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None, causal: bool = False,
                context: torch.Tensor | None = None, context_mask: torch.Tensor | None = None) -> torch.Tensor:
        self.key_source(x, mask, causal, context, context_mask)  # refuses a context
        b, n, _ = x.shape
        h = self.n_heads
        qk = split_heads(F.linear(x, self.q_proj.weight), h)  # query_key: W_q's weight, no bias
        v = split_heads(F.linear(x, self.v_proj.weight), h)  # value: W_v's weight, no bias
        valid = mask
        pad = (-n) % self.chunk_length if n > self.chunk_length else 0
        if pad:  # ReformerModel pads to a multiple of the chunk length with masked tokens
            qk = F.pad(qk, (0, 0, 0, pad))
            v = F.pad(v, (0, 0, 0, pad))
            real = torch.ones(b, n, dtype=torch.bool, device=x.device) if mask is None else mask.bool()
            valid = F.pad(real, (0, pad), value=False)
        elif valid is not None:
            valid = valid.bool()
        out = self.lsh_attention(qk, v, valid, causal)[:, :, :n]
        return self.out_proj(merge_heads(out))


register_attention(
    "reformer",
    paper=PAPER,
    equation="Sec. 2, Eqn. 2-4 (shared-QK LSH attention, chunked, multi-round)",
    capabilities=Capabilities(causal=True, padding_mask=True, variable_length=True, cross=False,
                              sized_by_max_len=True),
)(ReformerAttention)
