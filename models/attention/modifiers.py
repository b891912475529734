"""The two modifiers of papers/003 Section 2.3, written once and composed with any kernel.

* SH (Attention with Scaled Heads, Eqn. 25 + Remark 5): head s fits its support vector
  regression on N_s = ceil(N / f_s) keys/values computed from the *input* X average-pooled
  along the sequence with kernel = stride = f_s. Queries keep the full length N.
* BN (Batch Normalized Attention): as the experiments ran it (Eqn. 26 / Eqn. 51), queries and
  keys are both shifted by beta times the mean of that head's keys; ``bn_scale`` adds the
  per-dimension division by the keys' standard deviation of Eqn. 22-23.

Keys are carried in a :class:`KeySet` that records, besides k and v, which keys are valid and
from which query position each key may be seen under causality ("release time"). A full
resolution key j is released at position j. A pooled key covering input positions
[j*f, (j+1)*f) is released at the last (valid) position it covers, i.e. it is only seen by
queries i >= (j+1)*f - 1, so it never leaks a future token (for the last, partial window the
last covered position is N-1; with a padding mask it is the window's last valid position).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class KeySet:
    """Keys and values one group of heads attends over."""

    k: torch.Tensor  # (B, G, Nk, D)
    v: torch.Tensor  # (B, G, Nk, Dv)
    valid: torch.Tensor | None  # (B, Nk) bool, None = every key is real
    release: torch.Tensor | None  # (B or 1, Nk) long; None = full resolution (key j released at j)
    factor: int = 1  # SH pooling factor: query i sits at key-grid position i // factor

    @property
    def n_keys(self) -> int:
        return self.k.shape[-2]

    def release_times(self) -> torch.Tensor:
        """(B or 1, Nk) first query position allowed to see each key under causality."""
        if self.release is not None:
            return self.release
        return torch.arange(self.n_keys, device=self.k.device)[None]

    def valid_mask(self) -> torch.Tensor:
        """(B or 1, Nk) bool, True for real keys."""
        if self.valid is None:
            return torch.ones(1, self.n_keys, dtype=torch.bool, device=self.k.device)
        return self.valid

    def key_weights(self, dtype) -> torch.Tensor:
        """(B or 1, Nk) 1.0 for valid keys, 0.0 for padding."""
        if self.valid is None:
            return torch.ones(1, self.n_keys, dtype=dtype, device=self.k.device)
        return self.valid.to(dtype)


# --------------------------------------------------------------------------- SH (Remark 5)


def masked_average_pool(x: torch.Tensor, mask: torch.Tensor | None, factor: int):
    """Average-pool x (B, N, C) along the sequence with kernel = stride = factor (Remark 5).

    The last partial window and padded positions are handled by a masked mean (only valid
    positions are averaged; nothing is dropped). A pooled position is valid if any input
    position in its window is valid.

    Returns (pooled (B, Np, C), pooled_valid (B, Np) bool or None, release (B or 1, Np) long),
    Np = ceil(N / factor); ``release`` is the last valid position each window covers.
    """
    b, n, c = x.shape
    n_pooled = -(-n // factor)
    tail = n_pooled * factor - n
    weights = mask.to(x.dtype) if mask is not None else x.new_ones(1, n)
    weights = torch.nn.functional.pad(weights, (0, tail))  # (B or 1, Np*f)
    x = torch.nn.functional.pad(x, (0, 0, 0, tail))
    windows = weights.view(-1, n_pooled, factor)
    sums = (x * weights[..., None]).view(b, n_pooled, factor, c).sum(2)
    counts = windows.sum(-1)  # (B or 1, Np)
    pooled = sums / counts.clamp(min=1)[..., None]

    positions = torch.arange(n_pooled * factor, device=x.device).view(n_pooled, factor)
    last_valid = torch.where(windows > 0, positions, -1).amax(-1)  # (B or 1, Np)
    window_end = positions[:, -1].clamp(max=n - 1)
    release = torch.where(last_valid >= 0, last_valid, window_end)
    pooled_valid = counts > 0 if mask is not None else None
    return pooled, pooled_valid, release


def default_sh_factors(n_heads: int) -> list[int]:
    """The papers' downsampling factors for their head counts (Appendix A/J of papers/003).

    2 heads: [1, 2] (LRA, J.2); 4 heads: [1, 1, 2, 4] (ImageNet, J.3); 8 heads:
    [1, 1, 2, 2, 4, 4, 8, 8] (UEA, J.1). Other head counts: first half 1, second half 2.
    """
    table = {2: [1, 2], 4: [1, 1, 2, 4], 8: [1, 1, 2, 2, 4, 4, 8, 8]}
    if n_heads in table:
        return table[n_heads]
    return [1] * ((n_heads + 1) // 2) + [2] * (n_heads // 2)


# --------------------------------------------------------------------------- BN (Eqn. 22-23, 26)


def visible_key_counts(n_queries: int, keys: KeySet) -> torch.Tensor:
    """(B or 1, Nq) number of leading keys released to each query (release times are sorted)."""
    release = keys.release_times().contiguous()
    positions = torch.arange(n_queries, device=release.device).expand(release.shape[0], n_queries)
    return torch.searchsorted(release, positions.contiguous(), right=True)


def batch_normalize(q: torch.Tensor, keys: KeySet, beta, scale: bool, causal: bool, eps: float = 1e-5):
    """Attention-BN recentring (Eqn. 26; with ``scale`` Eqn. 22-23 with mu weighted by beta).

    mu is the mean of that head's (valid) keys, sigma^2 their per-dimension variance about mu:
        q' = (q - beta*mu) / sqrt(sigma^2 + eps),   k' = (k - beta*mu) / sqrt(sigma^2 + eps)
    (no division when ``scale`` is False). Returns (q', k').

    Causal use: the keys a query may see are only those released to it, so mu_i and sigma_i^2
    are the running statistics of the keys visible to query i. Then
        (q_i - b mu_i)^T diag(1/s_i^2) (k_j - b mu_i) = [(q_i - b mu_i)/s_i^2]^T k_j + const_i,
    and a per-query constant does not change a softmax over j, so it suffices to transform the
    queries and keep the keys. This is exact for softmax-type kernels (softmax, sparse) only;
    the caller must not use it for the linear kernel.
    """
    k = keys.k
    weights = keys.key_weights(k.dtype)[:, None, :, None]  # (B|1, 1, Nk, 1)
    if not causal:
        count = weights.sum(2, keepdim=True).clamp(min=1)
        mu = (k * weights).sum(2, keepdim=True) / count
        q_shifted, k_shifted = q - beta * mu, k - beta * mu
        if scale:
            inv_std = torch.rsqrt(((k - mu) ** 2 * weights).sum(2, keepdim=True) / count + eps)
            q_shifted, k_shifted = q_shifted * inv_std, k_shifted * inv_std
        return q_shifted, k_shifted

    n_q = q.shape[2]
    counts = visible_key_counts(n_q, keys)  # (B|1, Nq)
    index = (counts - 1).clamp(min=0)
    any_visible = (counts > 0).to(k.dtype)[:, None, :, None]

    def running(stat: torch.Tensor) -> torch.Tensor:  # prefix sum of stat over keys, read at each query
        prefix = stat.cumsum(2)
        idx = index[:, None, :, None].expand(prefix.shape[0], prefix.shape[1], n_q, prefix.shape[3])
        return prefix.gather(2, idx) * any_visible

    seen = running(weights.expand(k.shape[0], 1, -1, 1)).clamp(min=1)
    mu = running(k * weights) / seen
    q_shifted = q - beta * mu
    if scale:
        var = (running(k * k * weights) / seen - mu * mu).clamp(min=0)
        q_shifted = q_shifted / (var + eps)
    return q_shifted, k
