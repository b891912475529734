"""Primal-Attention (Chen et al., NeurIPS 2023; supplement = papers/004, Algorithm 1, Listing 1, Sec. B).

Per head (d = d_head, s = low_rank projection directions):
    phi_q(x_i) = q_i / ||q_i||,  phi_k(x_j) = k_j / ||k_j||      cosine feature maps, q = W_q x, k = W_k x
    e_i = W_e|X^T phi_q(x_i),    r_j = W_r|X^T phi_k(x_j)       e-/r-scores (Algorithm 1), s each
    o_i = W_o [e_i; r_i]                                       ``concat_proj``: 2s -> d, shared by heads
and the heads are concatenated and mapped by ``out_proj``. No value projection, no N x N matrix.

Projection weights:
* data_dependent=False: W_e|X = W_e, W_r|X = W_r of shape (heads, d, s).
* data_dependent=True (UEA/LRA/ImageNet): W_e|X = X'^T W_e with X' the n = min(s*rank_multi, N)
  rows of the layer input at evenly spaced positions floor(k (N-1) / (n-1)), k = 0..n-1 (the
  authors' code uses torch.linspace(0, N-1, n) cast to int), restricted to that head's channels
  (head h <-> input channels h*d..(h+1)*d-1 as in the public code); deterministic, identical in
  train and eval. W_e, W_r are allocated for n_max = s*rank_multi rows; for N < n_max only the
  first n = N rows are used. With a padding mask the rows are sampled from each sequence's
  valid positions only (N replaced by its valid length; unused rows contribute zero), so
  padding never changes the real tokens' outputs.

Causal Primal-Attention (Listing 1): q and k are replaced by their running means
(cumsum / count, over valid positions) before the feature maps. The sampled X' of the
data-dependent weights would see future tokens, so causal use requires data_dependent=False
(as in Listing 1, used for D4RL); forward raises otherwise.

KSVD objective (supplement Eqn. (1)), per sequence b and head h, with Lambda_h = diag(lam[h]):
    J_bh = 1/2 mean_i e_i^T Lambda_h e_i + 1/2 mean_j r_j^T Lambda_h r_j - Tr(W_e^T W_r)
* e/r terms use the valid positions of sequence b; the sums of Eqn. (1) are averaged over
  positions (as the authors' code does, so that the paper's eta values keep their meaning);
* the trace uses the raw parameters W_e, W_r (n x s, the rows actually used for b; d x s when
  data-independent), as in Eqn. (1) and the authors' code;
* Lemma 4.2: J = 0 at the KSVD stationary point, and the supplement "minimizes the total loss
  to zero"; J itself is unbounded below, so the term handed to the trainer is its square, like
  the authors' code: auxiliary_loss() = mean over batch and heads of J_bh^2 (each sequence's
  each head is its own KSVD problem, squared separately; the code squares after averaging
  over heads). Layers: collect_auxiliary_loss() sums over Primal layers (the authors' code
  averages over layers: divide eta by the number of Primal layers to match it).
``ksvd_objective`` keeps the unsquared (B, H) values of the last forward pass for logging.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from models.attention.base import AttentionBase, merge_heads, split_heads
from models.attention.registry import Capabilities, register_attention

PAPER = (
    "Chen et al., Primal-Attention: Self-attention through Asymmetric Kernel SVD in Primal Representation, "
    "NeurIPS 2023 (papers/004)"
)


def evenly_spaced_rows(mask: torch.Tensor | None, batch: int, length: int, n_max: int, device):
    """Positions of the n = min(n_max, valid length) sampled rows of each sequence.

    Returns (positions (B, n_max) long, used (B, n_max) bool, n (B,) long); rows k >= n are unused.
    """
    if mask is None:
        valid_len = torch.full((batch,), length, device=device)
        order = torch.arange(length, device=device).expand(batch, length)
    else:
        valid_len = mask.sum(1)
        order = torch.argsort((~mask).to(torch.int8), dim=1, stable=True)  # valid positions first, in order
    n = valid_len.clamp(max=n_max)
    k = torch.arange(n_max, device=device)
    rank = (k * (valid_len[:, None] - 1)) // (n[:, None] - 1).clamp(min=1)  # floor(k (L-1)/(n-1))
    used = k < n[:, None]
    rank = torch.where(used, rank, 0).clamp(max=length - 1)
    return order.gather(1, rank), used, n


@register_attention(
    "primal",
    paper=PAPER,
    equation="Algorithm 1; KSVD objective Eqn. (1); causal: Listing 1",
    capabilities=Capabilities(extra_loss=True),
    summary="Primal-Attention: e/r-scores of cosine feature maps, KSVD objective as auxiliary loss",
)
class PrimalAttention(AttentionBase):
    """Primal-Attention with data-dependent or data-independent projection weights (papers/004)."""

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        *,
        low_rank: int = 20,
        rank_multi: int = 10,
        data_dependent: bool = True,
        dropout: float = 0.0,
        bias: bool = True,
        **unused,
    ):
        # dropout is accepted for interface uniformity; Primal-Attention has no attention probabilities.
        super().__init__(d_model, n_heads, dropout, bias, **unused)
        self.low_rank, self.rank_multi, self.data_dependent = low_rank, rank_multi, data_dependent
        self.q_proj = nn.Linear(d_model, d_model, bias=bias)  # W_q
        self.k_proj = nn.Linear(d_model, d_model, bias=bias)  # W_k
        rows = low_rank * rank_multi if data_dependent else self.d_head  # n_max or p = d
        self.we = nn.Parameter(torch.empty(n_heads, rows, low_rank))
        self.wr = nn.Parameter(torch.empty(n_heads, rows, low_rank))
        for h in range(n_heads):  # orthogonal init per head, as the authors' orthogonal_
            nn.init.orthogonal_(self.we.data[h])
            nn.init.orthogonal_(self.wr.data[h])
        self.lam = nn.Parameter(torch.rand(n_heads, low_rank))  # Lambda (learnable), uniform init as the code
        self.concat_proj = nn.Linear(2 * low_rank, self.d_head, bias=bias)  # W_o of Algorithm 1
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)
        self._auxiliary_loss: torch.Tensor | None = None
        self.ksvd_objective: torch.Tensor | None = None

    def projection_weights(self, x: torch.Tensor, mask: torch.Tensor | None):
        """(W_e|X, W_r|X) of shape (B|1, H, d, s) and the KSVD trace term Tr(W_e^T W_r) (B|1, H)."""
        row_products = (self.we * self.wr).sum(-1)  # (H, rows): Tr(W_e^T W_r) = sum over rows
        if not self.data_dependent:
            return self.we[None], self.wr[None], row_products.sum(-1)[None]
        b, n, _ = x.shape
        n_max = self.we.shape[1]
        positions, used, n_used = evenly_spaced_rows(mask, b, n, n_max, x.device)
        sampled = x.gather(1, positions[..., None].expand(-1, -1, x.shape[-1])) * used[..., None].to(x.dtype)
        sampled = split_heads(sampled, self.n_heads)  # X' per head: (B, H, n_max, d)
        we_x = torch.einsum("bhnd,hns->bhds", sampled, self.we)  # W_e|X = X'^T W_e
        wr_x = torch.einsum("bhnd,hns->bhds", sampled, self.wr)
        trace = row_products.cumsum(-1)[:, (n_used - 1).clamp(min=0)].T * (n_used > 0)[:, None]  # first n rows
        return we_x, wr_x, trace

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None, causal: bool = False) -> torch.Tensor:
        if causal and self.data_dependent:
            raise ValueError(
                "causal Primal-Attention needs data_dependent=false (Listing 1): the sampled rows X' of the "
                "data-dependent weights would include future tokens"
            )
        h = self.n_heads
        q = split_heads(self.q_proj(x), h)
        k = split_heads(self.k_proj(x), h)
        weights = None if mask is None else mask[:, None, :, None].to(x.dtype)
        if causal:  # Listing 1: running means before the feature maps
            count = torch.arange(1, x.shape[1] + 1, device=x.device, dtype=x.dtype)[:, None]
            if weights is not None:
                q, k, count = q * weights, k * weights, weights.cumsum(2).clamp(min=1)
            q, k = q.cumsum(2) / count, k.cumsum(2) / count
        phi_q, phi_k = F.normalize(q, p=2, dim=-1), F.normalize(k, p=2, dim=-1)  # cosine feature maps
        we_x, wr_x, trace = self.projection_weights(x, mask)
        e = torch.einsum("bhnd,bhds->bhns", phi_q, we_x)  # e-scores
        r = torch.einsum("bhnd,bhds->bhns", phi_k, wr_x)  # r-scores
        out = self.concat_proj(torch.cat([e, r], dim=-1))  # W_o [e; r]
        self._record_ksvd(e, r, trace, weights)
        return self.out_proj(merge_heads(out))

    def _record_ksvd(self, e, r, trace, weights) -> None:
        """J of Eqn. (1) per sequence and head (see module docstring) and its squared mean."""
        lam = self.lam[None, :, None, :]
        energy = 0.5 * ((e * e * lam).sum(-1) + (r * r * lam).sum(-1))  # (B, H, N)
        if weights is None:
            energy = energy.mean(-1)
        else:
            w = weights[..., 0]
            energy = (energy * w).sum(-1) / w.sum(-1).clamp(min=1)
        objective = energy - trace
        self.ksvd_objective = objective.detach()
        self._auxiliary_loss = (objective**2).mean()

    def auxiliary_loss(self) -> torch.Tensor | None:
        """Squared KSVD objective of the most recent forward pass (the trainer adds eta times it)."""
        return self._auxiliary_loss
