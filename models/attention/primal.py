"""Primal-Attention (Chen et al., NeurIPS 2023; supplement = papers/004, Algorithm 1, Listing 1, Sec. B).

Per head (d = d_head, s = low_rank projection directions):
    phi_q(x_i) = q_i / ||q_i||,  phi_k(x_j) = k_j / ||k_j||      cosine feature maps, q = W_q x, k = W_k x
    e_i = W_e|X^T phi_q(x_i),    r_j = W_r|X^T phi_k(x_j)       e-/r-scores (Algorithm 1), s each
    o_i = W_o [e_i; r_i]                                       ``concat_proj``: 2s -> d, shared by heads
and the heads are concatenated and mapped by ``out_proj``. No value projection, no N x N matrix.

Projection weights:
* data_dependent=False: W_e|X = W_e, W_r|X = W_r of shape (heads, d, s) (D4RL, WikiText-103).
* data_dependent=True (UEA/LRA/ImageNet): W_e|X = X'^T W_e with X' the rows of the layer input
  sampled at evenly spaced positions (``row_positions``), restricted to that head's
  channels (head h <-> input channels h*d..(h+1)*d-1, as the public code); deterministic,
  identical in train and eval. W_e, W_r have ``rows`` rows; what a sequence shorter than that
  (N < rows) uses depends on the ``rows`` option below.

Causal Primal-Attention (Listing 1): q and k are replaced by their running means (cumsum / count)
before the feature maps. The sampled X' of the data-dependent weights would see future tokens, so
causal use requires data_dependent=False (as in Listing 1, used for D4RL); forward raises otherwise.

KSVD objective (supplement Eqn. (1)), per sequence b and head h, with Lambda_h = diag(lam[h]):
    J_bh = 1/2 mean_i f(e_i) + 1/2 mean_j f(r_j) - Tr(W_e^T W_r)
The sums of Eqn. (1) are averaged over positions (as every authors' code does, so the published
eta values keep their meaning); the trace uses the raw parameters W_e, W_r (the rows used for b;
d x s when data-independent), as Eqn. (1) and the authors' scripts (``--trace_no_x``).
J is unbounded below and Lemma 4.2 puts the KSVD stationary point at J = 0, so the trainer gets
J squared; ``collect_auxiliary_loss`` sums or averages that over the Primal layers (model option
``ksvd_layers``: the authors' code averages, ``loss_ksvd / len(score_list)``).

Options where the authors' code (yingyichen-cyy/PrimalAttention) differs from the equations; the
defaults are the equations / the principled choice, the reproduction experiments set the code's
(conf/experiment/primal_attention/*.yaml, ``primal_options``):

``ksvd_form``      paper: f(e) = e^T Lambda e (Eqn. (1)).
                   code:  f(e) = ||Lambda e||^2 = e^T Lambda^2 e: every authors' loss (CV
                   engine_primal.py, UEA models/loss.py, LRA model_wrapper.py, NLP criterions/
                   cross_entropy.py, RL seq_trainer.py) takes ``einsum(e, diag(Lambda)).norm()**2``.
``ksvd_square``    where the square is taken (J_bh of the last forward pass, see ``auxiliary_loss``):
                   per_sample_head: mean over b, h of J_bh^2 (each sequence's each head its own KSVD).
                   per_sample: mean over b of (mean_h J_bh)^2 -- the UEA (models/loss.py), NLP
                     (cross_entropy.py) and RL (seq_trainer.py) code: energies averaged over heads
                     and positions per sample, the trace averaged over heads, squared per sample.
                   per_batch: (mean over b, h of J_bh)^2 -- the CV (engine_primal.py) and LRA
                     (model_wrapper.py) code: one mean over batch, heads and positions, squared once.
``rows``           full: s * rank_multi rows in W_e, W_r. A sequence of N < rows (valid) positions
                     samples each position once, n = N rows, and uses the first N rows of W_e, W_r
                     (in the products and in the trace).
                   code: min(max_len, s * rank_multi), max_len the task's sequence length, which
                     models.roles passes in (UEA Primal_Attention.py, CV models_primal.py:
                     min(max_seq_len, s * rank_multi); without a max_len: s * rank_multi, as the LRA
                     code allocates). A sequence of N < rows positions uses every row all the
                     same, sampling positions with repeats: the code's ``torch.linspace(0, N-1,
                     rows, dtype=int)`` (UEA Primal_Attention.py, LRA attentions/attention.py)
                     repeats positions when it asks for more points than there are; the CV code
                     (``gen_weights``) only meets N = rows there.
``init``           per_head: each head's (rows, s) matrix orthogonal (orthonormal columns).
                   code: ``nn.init.orthogonal_`` on the whole (heads, rows, s) tensor, as every
                     authors' module does; torch flattens it to (heads, rows * s), so each head's
                     matrix is one unit-norm row of an orthonormal set (Frobenius norm 1).
                     Also ``block_init = "torch"``: the ViT/DeiT backbone (models/vision.py), which
                     re-initialises its blocks (timm: normal(0.02), zero biases), gives the block
                     holding this layer PyTorch's default Linear init back (kaiming_uniform(a=sqrt(5))
                     weights, uniform(+-1/sqrt(fan_in)) biases), as the CV code's
                     ``ComboVisionTransformer`` (models_combo.py) inserts its Primal block after
                     timm's init. Other backbones do not read it.
``padding``        valid: rows are sampled from each sequence's valid positions, running means and
                     KSVD terms use valid positions only: padding never changes real outputs.
                   ignore: the mask is not used; padded positions are tokens (rows over the padded
                     length, in the running means and in the KSVD terms): the UEA, CV and RL code,
                     which pass no mask to Primal-Attention.
                   zero_output: as ignore, and the padded positions' outputs are zeroed before
                     ``out_proj``: the LRA code (attention_primal_cos.py, ``concate_weight(score) * mask``).
``row_positions``  floor: floor(k (N-1) / (n-1)), k = 0..n-1 (exact even spacing).
                   linspace: ``torch.linspace(0, N-1, n, dtype=long)``, the authors' rule (UEA, LRA,
                     CV); torch's integer linspace differs from floor for some (N, n), e.g. at
                     k = 11, 22, 44 for N = 136, n = 100.

Auxiliary-loss state: a layer keeps the J of its most recent forward pass only, so nothing leaks
from one step (or an evaluation) into the next. A model that runs the same layers more than once
in one forward (the LRA retrieval dual encoder) wraps the passes in
``accumulate_auxiliary_losses(model)``; J is then averaged over the passes before the square, as
the LRA code averages the two documents' terms (``0.5 * (loss_escore_0 + loss_escore_1) ...``).
``ksvd_objective`` is that (B, H) J, detached, for logging.
"""
from __future__ import annotations

from functools import lru_cache

import torch
import torch.nn as nn
import torch.nn.functional as F

from attnbench.models.attention.base import AttentionBase, merge_heads, split_heads
from attnbench.models.attention.registry import Capabilities, register_attention

PAPER = (
    "Chen et al., Primal-Attention: Self-attention through Asymmetric Kernel SVD in Primal Representation, "
    "NeurIPS 2023 (papers/004)"
)

CHOICES = {
    "ksvd_form": ("paper", "code"),
    "ksvd_square": ("per_sample_head", "per_sample", "per_batch"),
    "rows": ("full", "code"),
    "init": ("per_head", "code"),
    "padding": ("valid", "ignore", "zero_output"),
    "row_positions": ("floor", "linspace"),
}


@lru_cache(maxsize=256)
def _linspace_positions(length: int, n: int) -> torch.Tensor:
    """The authors' rule ``torch.linspace(0, N-1, n, dtype=int)``, on the CPU as their code runs it."""
    return torch.linspace(0, length - 1, n, dtype=torch.long)


def evenly_spaced_rows(mask: torch.Tensor | None, batch: int, length: int, n_max: int, device,
                       rule: str = "floor", repeat: bool = False):
    """Positions of the n sampled rows of each sequence (L = its valid length).

    ``rule``: ``floor`` (floor(k (L-1)/(n-1))) or ``linspace`` (torch's integer linspace).
    ``repeat``: False (rows=full): n = min(n_max, L), every position at most once.
    True (rows=code): n = n_max whenever L > 0; for L < n_max the rule spreads the n_max rows over
    L positions, so positions repeat, as the authors' ``torch.linspace(0, L-1, n_max, dtype=int)``.
    Returns (positions (B, n_max) long, used (B, n_max) bool, n (B,) long); rows k >= n are unused.
    """
    if mask is None:
        valid_len = torch.full((batch,), length, device=device)
        order = torch.arange(length, device=device).expand(batch, length)
    else:
        valid_len = mask.sum(1)
        order = torch.argsort((~mask).to(torch.int8), dim=1, stable=True)  # valid positions first, in order
    n = torch.where(valid_len > 0, n_max, 0) if repeat else valid_len.clamp(max=n_max)
    k = torch.arange(n_max, device=device)
    used = k < n[:, None]
    if rule == "floor":
        rank = (k * (valid_len[:, None] - 1)) // (n[:, None] - 1).clamp(min=1)
    else:
        rank = torch.zeros(batch, n_max, dtype=torch.long, device=device)
        lengths = [length] if mask is None else valid_len.tolist()
        for value in sorted(set(lengths)):
            if value == 0:
                continue
            m = n_max if repeat else min(n_max, value)
            rows = _linspace_positions(int(value), int(m)).to(device)
            if mask is None:
                rank[:, :m] = rows
            else:
                rank[valid_len == value, :m] = rows
    rank = torch.where(used, rank, 0).clamp(max=length - 1)
    return order.gather(1, rank), used, n


@register_attention(
    "primal",
    paper=PAPER,
    equation="Algorithm 1; KSVD objective Eqn. (1); causal: Listing 1",
    capabilities=Capabilities(causal=True, padding_mask=True, extra_loss=True, sized_by_max_len=True),
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
        ksvd_form: str = "paper",
        ksvd_square: str = "per_sample_head",
        rows: str = "full",
        init: str = "per_head",
        padding: str = "valid",
        row_positions: str = "floor",
        max_len: int | None = None,
        dropout: float = 0.0,
        bias: bool = True,
        **unused,
    ):
        # dropout is accepted for interface uniformity; Primal-Attention has no attention probabilities
        # (the authors' UEA PrimalCosAttention builds a Dropout it never applies).
        super().__init__(d_model, n_heads, dropout, bias, **unused)
        given = {"ksvd_form": ksvd_form, "ksvd_square": ksvd_square, "rows": rows, "init": init,
                 "padding": padding, "row_positions": row_positions}
        for option, value in given.items():
            if value not in CHOICES[option]:
                raise ValueError(f"primal: {option}={value!r} is not one of {', '.join(CHOICES[option])}")
        self.low_rank, self.rank_multi, self.data_dependent = low_rank, rank_multi, data_dependent
        self.ksvd_form, self.ksvd_square, self.padding, self.row_positions = ksvd_form, ksvd_square, padding, row_positions
        self.rows = rows
        self.q_proj = nn.Linear(d_model, d_model, bias=bias)  # W_q
        self.k_proj = nn.Linear(d_model, d_model, bias=bias)  # W_k
        if not data_dependent:
            n_rows = self.d_head  # p = d
        elif rows == "code" and max_len is not None:
            n_rows = min(int(max_len), low_rank * rank_multi)
        else:
            n_rows = low_rank * rank_multi  # n_max
        self.we = nn.Parameter(torch.empty(n_heads, n_rows, low_rank))
        self.wr = nn.Parameter(torch.empty(n_heads, n_rows, low_rank))
        # The backbone reads block_init (module docstring, ``init``): the CV code's Primal block keeps torch's defaults
        self.block_init = "torch" if init == "code" else None
        if init == "code":  # torch flattens (heads, rows, s) to (heads, rows * s): see the module docstring
            nn.init.orthogonal_(self.we)
            nn.init.orthogonal_(self.wr)
        else:
            for h in range(n_heads):
                nn.init.orthogonal_(self.we.data[h])
                nn.init.orthogonal_(self.wr.data[h])
        self.lam = nn.Parameter(torch.rand(n_heads, low_rank))  # Lambda (learnable), uniform init as the code
        self.concat_proj = nn.Linear(2 * low_rank, self.d_head, bias=bias)  # W_o of Algorithm 1
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)
        self._objectives: list[torch.Tensor] = []  # J (B, H) of each pass of the latest model forward
        self._accumulating = False

    def extra_repr(self) -> str:
        return (f"low_rank={self.low_rank}, rows={self.we.shape[1]} ({self.rows}), data_dependent={self.data_dependent}, "
                f"ksvd_form={self.ksvd_form}, ksvd_square={self.ksvd_square}, padding={self.padding}, "
                f"row_positions={self.row_positions}")

    def projection_weights(self, x: torch.Tensor, mask: torch.Tensor | None):
        """(W_e|X, W_r|X) of shape (B|1, H, d, s) and the KSVD trace term Tr(W_e^T W_r) (B|1, H)."""
        row_products = (self.we * self.wr).sum(-1)  # (H, rows): Tr(W_e^T W_r) = sum over rows
        if not self.data_dependent:
            return self.we[None], self.wr[None], row_products.sum(-1)[None]
        b, n, _ = x.shape
        n_max = self.we.shape[1]
        positions, used, n_used = evenly_spaced_rows(mask, b, n, n_max, x.device, self.row_positions,
                                                     repeat=self.rows == "code")
        sampled = x.gather(1, positions[..., None].expand(-1, -1, x.shape[-1])) * used[..., None].to(x.dtype)
        sampled = split_heads(sampled, self.n_heads)  # X' per head: (B, H, n_max, d)
        we_x = torch.einsum("bhnd,hns->bhds", sampled, self.we)  # W_e|X = X'^T W_e
        wr_x = torch.einsum("bhnd,hns->bhds", sampled, self.wr)
        trace = row_products.cumsum(-1)[:, (n_used - 1).clamp(min=0)].T * (n_used > 0)[:, None]  # first n rows
        return we_x, wr_x, trace

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None, causal: bool = False,
                context: torch.Tensor | None = None, context_mask: torch.Tensor | None = None) -> torch.Tensor:
        if context is not None or context_mask is not None:
            raise ValueError(
                "Primal-Attention cannot attend to another sequence: its e- and r-scores pair query i with "
                "key i of the same sequence (Algorithm 1), so there is no cross-attention form"
            )
        if causal and self.data_dependent:
            raise ValueError(
                "causal Primal-Attention needs data_dependent=false (Listing 1): the sampled rows X' of the "
                "data-dependent weights would include future tokens"
            )
        token_mask = mask if self.padding == "valid" else None  # ignore / zero_output: padding counts as tokens
        h = self.n_heads
        q = split_heads(self.q_proj(x), h)
        k = split_heads(self.k_proj(x), h)
        weights = None if token_mask is None else token_mask[:, None, :, None].to(x.dtype)
        if causal:  # Listing 1: running means before the feature maps
            count = torch.arange(1, x.shape[1] + 1, device=x.device, dtype=x.dtype)[:, None]
            if weights is not None:
                q, k, count = q * weights, k * weights, weights.cumsum(2).clamp(min=1)
            q, k = q.cumsum(2) / count, k.cumsum(2) / count
        phi_q, phi_k = F.normalize(q, p=2, dim=-1), F.normalize(k, p=2, dim=-1)  # cosine feature maps
        we_x, wr_x, trace = self.projection_weights(x, token_mask)
        e = torch.einsum("bhnd,bhds->bhns", phi_q, we_x)  # e-scores
        r = torch.einsum("bhnd,bhds->bhns", phi_k, wr_x)  # r-scores
        out = self.concat_proj(torch.cat([e, r], dim=-1))  # W_o [e; r]
        if self.padding == "zero_output" and mask is not None:
            out = out * mask[:, None, :, None].to(out.dtype)
        self._record_ksvd(e, r, trace, weights)
        return self.out_proj(merge_heads(out))

    def _record_ksvd(self, e, r, trace, weights) -> None:
        """J of Eqn. (1) per sequence and head (see the module docstring)."""
        # At least float32 under half-precision autocast: e * e of an fp16 score above 256 overflows.
        e, r = (t.to(torch.promote_types(t.dtype, torch.float32)) for t in (e, r))
        lam = self.lam[None, :, None, :]
        if self.ksvd_form == "code":
            lam = lam * lam  # ||Lambda e||^2 = e^T Lambda^2 e
        energy = 0.5 * ((e * e * lam).sum(-1) + (r * r * lam).sum(-1))  # (B, H, N)
        if weights is None:
            energy = energy.mean(-1)
        else:
            w = weights[..., 0]
            energy = (energy * w).sum(-1) / w.sum(-1).clamp(min=1)
        objective = energy - trace
        if self._accumulating:
            self._objectives.append(objective)
        else:
            self._objectives = [objective]

    def accumulate_passes(self, on: bool) -> None:
        """Start (clearing earlier terms) or stop averaging J over the forward passes in between
        (see ``models.attention.base.accumulate_auxiliary_losses``)."""
        if on:
            self._objectives = []
        self._accumulating = on

    def _objective(self) -> torch.Tensor | None:
        if not self._objectives:
            return None
        if len(self._objectives) == 1:
            return self._objectives[0]
        return torch.stack(self._objectives).mean(0)

    @property
    def ksvd_objective(self) -> torch.Tensor | None:
        """Unsquared J (B, H) of the most recent model forward (averaged over its passes), detached."""
        j = self._objective()
        return None if j is None else j.detach()

    def auxiliary_loss(self) -> torch.Tensor | None:
        """Squared KSVD objective of the most recent model forward (the trainer adds eta times it)."""
        j = self._objective()
        if j is None:
            return None
        if self.ksvd_square == "per_sample_head":
            return (j**2).mean()
        if self.ksvd_square == "per_sample":
            return (j.mean(1) ** 2).mean()
        return j.mean() ** 2
