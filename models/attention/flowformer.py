"""Flow-Attention (Wu et al., "Flowformer: Linearizing Transformers with Conservation Flows", ICML 2022).

Attention as a flow network from sources (keys, values) to sinks (queries), per head, with
non-negative features phi (sigmoid) and eps = 1e-6 added to features and sums as the code does:
    incoming flow of sink i     I_i = 1 / ((phi(q_i) + eps) . (sum_j phi(k_j) + eps))
    outgoing flow of source j   O_j = 1 / ((phi(k_j) + eps) . (sum_i phi(q_i) + eps))
    conservation                I^_i = (phi(q_i) + eps) . (sum_j phi(k_j) O_j + eps)
                                O^_j = (phi(k_j) + eps) . (sum_i phi(q_i) I_i + eps)
    competition (sources)       c_j = m softmax_j(O^)            (m keys, n queries)
    allocation (sinks)          a_i = sigmoid(I^_i n / m)
    output                      o_i = a_i I_i phi(q_i)^T sum_j phi(k_j) (c_j v_j)^T
Causal form (Flow_Attention_Causal): every sum over j becomes a prefix sum over j <= i (over
i <= j for the sources), normalised by the count c_i = i + 1 of the prefix: I_i, O_j are
multiplied by it and I^, O^ divided by it, c_j = c_j-count * exp(O^_j) / sum_{j' <= j} exp(O^_j'),
a_i = sigmoid(I^_i), and o_i uses the prefix sums with I_i (the un-multiplied incoming flow).
Equation numbers of the paper were not checked here (it is not in shared/papers).

Reference code thuml/Flowformer, one function per family; the families differ, options here:
=================  ==========  ========  ===============  ================  ====================
family / file      phi         causal    clamp of O^      dropout (output)  padding mask
=================  ==========  ========  ===============  ================  ====================
Flow_Attention.py  sigmoid     both      [-1, 1]          yes, p=0.05       none
TimeSeries/models/ sigmoid     no        none             created, unused   none passed
 Flow_Attention.py
LRA/.../flow_      relu+1e-6   no        none             none              dropped (JAX)
 attention.py
NLP/flow_          sigmoid     causal    [-5, 5]          created, unused   v.masked_fill not in
 attention.py                  only                                         place: no effect
RL/.../flowformer_ sigmoid     causal    [-10, 10]        yes, resid_pdrop  none (right padding,
 attention.py                  only                        (0.1)            causal: not needed)
=================  ==========  ========  ===============  ================  ====================
eps = 1e-6 everywhere; all use four nn.Linear(d, d) with bias (q, k, v, out). The n/m ratio is in
every non-causal form. The LRA code's competition ``nn.softmax(conserved_source, axis=-1)`` acts
on a [batch, keys, heads] array, i.e. over the heads of each source, not over the sources.
Primal-Attention's D4RL code (PrimalAttention_RL) carries the RL file unchanged.

Options: ``feature_map`` (sigmoid | relu = relu + 1e-6, the LRA code), ``eps``, ``source_clamp``
(None | c: clamp O^ to [-c, c]), ``competition_over`` (sources | heads, the LRA code's axis;
bidirectional only), ``output_dropout`` (apply ``dropout`` after the output projection, as
Flow_Attention.py and the RL code; otherwise ``dropout`` is unused, as in the TimeSeries/NLP
code) and ``padding``:
* valid: padded tokens get zero features (no flow in or out), are left out of the competition
  softmax and of the counts n, m (and the causal prefix counts): real outputs never depend on
  padded tokens, and a right-padded row gives the unpadded sequence's outputs;
* ignore: the mask is not used, padded tokens are tokens (every reference).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from attnbench.models.attention.base import ProjectedAttention
from attnbench.models.attention.kernels import causal_linear_product
from attnbench.models.attention.registry import Capabilities, register_attention

FEATURE_MAPS = {
    "sigmoid": torch.sigmoid,  # Flow_Attention.py, TimeSeries, NLP, RL ``kernel_method``
    "relu": lambda x: F.relu(x) + 1e-6,  # LRA flow_attention.py ``kernel_feature_map``
}
PADDING_MODES = ("valid", "ignore")
COMPETITION_AXES = ("sources", "heads")


def _safe_divisor(x: torch.Tensor) -> torch.Tensor:
    """x where positive, else 1: only rows or prefixes with no real token have 0 there."""
    return torch.where(x > 0, x, torch.ones_like(x))


@register_attention(
    "flowformer",
    paper="Wu et al. 2022, Flowformer: Linearizing Transformers with Conservation Flows (ICML); code thuml/Flowformer",
    equation="Sec. 3: incoming/outgoing flows, flow conservation, competition (softmax) and allocation (sigmoid)",
    capabilities=Capabilities(causal=True, padding_mask=True, cross=False),
)
class FlowAttention(ProjectedAttention):
    """Flow-Attention: sigmoid features, conserved flows, source competition and sink allocation."""

    cross_unsupported_reason = ("the reference codes run Flow-Attention as self-attention only "
                                "(the non-causal form would take a context; not wired up here)")

    def __init__(self, d_model: int, n_heads: int, dropout: float = 0.0, bias: bool = True,
                 feature_map: str = "sigmoid", eps: float = 1e-6, source_clamp: float | None = None,
                 competition_over: str = "sources", output_dropout: bool = False, padding: str = "valid",
                 **unused):
        super().__init__(d_model, n_heads, dropout, bias, **unused)
        if feature_map not in FEATURE_MAPS:
            raise ValueError(f"flowformer feature_map must be one of {', '.join(FEATURE_MAPS)}, got {feature_map!r}")
        if padding not in PADDING_MODES:
            raise ValueError(f"flowformer padding must be one of {', '.join(PADDING_MODES)}, got {padding!r}")
        if competition_over not in COMPETITION_AXES:
            raise ValueError(f"flowformer competition_over must be one of {', '.join(COMPETITION_AXES)}, "
                             f"got {competition_over!r}")
        if source_clamp is not None and source_clamp <= 0:
            raise ValueError(f"flowformer source_clamp must be positive or null, got {source_clamp}")
        self.feature_map, self.eps, self.padding = feature_map, float(eps), padding
        self.source_clamp = None if source_clamp is None else float(source_clamp)
        self.output_dropout, self.competition_over = bool(output_dropout), competition_over

    def extra_repr(self) -> str:
        return (f"feature_map={self.feature_map}, eps={self.eps}, source_clamp={self.source_clamp}, "
                f"competition_over={self.competition_over}, output_dropout={self.output_dropout}, "
                f"padding={self.padding}")

    def forward(self, x, mask=None, causal=False, context=None, context_mask=None):
        out = super().forward(x, mask, causal, context, context_mask)
        if self.output_dropout and self.training and self.dropout > 0:
            out = F.dropout(out, p=self.dropout)  # Flow_Attention.py / RL: self.dropout(out_projection(x))
        return out

    def kernel(self, q, k, v, mask, causal):
        phi = FEATURE_MAPS[self.feature_map]
        q, k = phi(q.contiguous()), phi(k.contiguous())  # one copy each out of split_heads' layout, not one per product
        valid = mask if self.padding == "valid" else None
        if valid is not None:
            weight = valid[:, None, :, None].to(q.dtype)
            q, k = q * weight, k * weight  # no flow into or out of padded tokens
        if causal:
            return self._causal(q, k, v, valid)
        return self._bidirectional(q, k, v, valid)

    def _clamp(self, conserved_source: torch.Tensor) -> torch.Tensor:
        if self.source_clamp is None:
            return conserved_source
        return conserved_source.clamp(-self.source_clamp, self.source_clamp)  # "for stability"

    def _bidirectional(self, q, k, v, valid):
        """Flow_Attention.forward (TimeSeries: Flow_Attention.forward with normalizer_row/col)."""
        eps = self.eps
        if valid is None:
            n_queries = n_keys = torch.tensor(float(q.shape[2]), dtype=q.dtype, device=q.device)
        else:
            n_queries = n_keys = _safe_divisor(valid.sum(-1).to(q.dtype))[:, None, None]  # self-attention: n = m
        q_eps, k_eps = q + eps, k + eps
        sink_incoming = 1.0 / (q_eps @ (k.sum(2) + eps)[..., None]).squeeze(-1)
        source_outgoing = 1.0 / (k_eps @ (q.sum(2) + eps)[..., None]).squeeze(-1)
        # sum_j phi(k_j) O_j as a vector-matrix product (no N x d temporary)
        conserved_sink = (q_eps @ ((source_outgoing[..., None, :] @ k).transpose(-1, -2) + eps)).squeeze(-1)
        conserved_source = (k_eps @ ((sink_incoming[..., None, :] @ q).transpose(-1, -2) + eps)).squeeze(-1)
        conserved_source = self._clamp(conserved_source)
        sink_allocation = torch.sigmoid(conserved_sink * (n_queries / n_keys))
        if self.competition_over == "heads":  # LRA flow_attention.py: softmax over axis -1 of [b, s, h]
            source_competition = torch.softmax(conserved_source, dim=1) * n_keys
        else:
            if valid is not None:  # padded sources take no share of the competition
                conserved_source = conserved_source.masked_fill(~valid[:, None, :], torch.finfo(q.dtype).min)
            source_competition = torch.softmax(conserved_source, dim=-1) * n_keys
        if valid is not None:
            source_competition = source_competition * valid[:, None, :]  # a fully padded row: 0, not 1/m
        kv = k.transpose(-1, -2) @ (v * source_competition[..., None])
        return (q @ kv) * (sink_incoming * sink_allocation)[..., None]

    def _causal(self, q, k, v, valid):
        """Flow_Attention_Causal.forward (NLP flow_attention.py, RL flowformer_attention.py)."""
        eps = self.eps
        n = q.shape[2]
        if valid is None:
            count = torch.arange(1, n + 1, device=q.device, dtype=q.dtype)[None, None, :]  # ``normal``
        else:  # real tokens up to i; 1 before the first one (nothing flows there)
            count = _safe_divisor(valid.to(q.dtype).cumsum(-1))[:, None, :]
        sink_incoming = 1.0 / torch.einsum("bhnd,bhnd->bhn", q + eps, k.cumsum(2) + eps)
        source_outgoing = 1.0 / torch.einsum("bhnd,bhnd->bhn", k + eps, q.cumsum(2) + eps)
        conserved_sink = torch.einsum(
            "bhnd,bhnd->bhn", q + eps, (k * (source_outgoing * count)[..., None]).cumsum(2) + eps) / count
        conserved_source = torch.einsum(
            "bhnd,bhnd->bhn", k + eps, (q * (sink_incoming * count)[..., None]).cumsum(2) + eps) / count
        conserved_source = self._clamp(conserved_source)
        sink_allocation = torch.sigmoid(conserved_sink)
        source_weight = torch.exp(conserved_source)
        if valid is not None:
            source_weight = source_weight * valid[:, None, :]
        source_competition = source_weight / _safe_divisor(source_weight.cumsum(-1)) * count
        out = causal_linear_product(q * sink_incoming[..., None], k, v * source_competition[..., None])
        return out * sink_allocation[..., None]
