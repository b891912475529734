"""cosFormer attention (Qin et al., "cosFormer: Rethinking Softmax in Attention", ICLR 2022).

Per head, with ReLU features and the cos-based re-weighting of Sec. 3.3:
    s(q_i, k_j) = relu(q_i)^T relu(k_j) cos(pi/2 * (i - j) / M)
    o_i = sum_j s(q_i, k_j) v_j / max(sum_j s(q_i, k_j), eps)
Ptolemy's identity cos(a - b) = cos a cos b + sin a sin b makes it linear: with
    q~_i = [relu(q_i) sin(pi i / 2M); relu(q_i) cos(pi i / 2M)]  (2d features, likewise k~_j)
s(q_i, k_j) = q~_i^T k~_j, so o_i = q~_i^T (sum_j k~_j v_j^T) / max(q~_i^T sum_j k~_j, eps), and the
causal form sums over j <= i only (prefix sums). Equation numbers of the paper were not checked
here (the paper is not in shared/papers); the code below follows the authors' implementation.

Reference code: OpenNLPLab/cosFormer ``cosformer.py`` (``CosformerAttention.forward``):
* positions are 1-based, i = 1..L (``torch.arange(1, seq_len + 1)``), and M = max(src_len, tgt_len),
  the length of the (padded) input tensor, so in a padded batch M is the padded length, not a
  row's real length (UEA's mvts_transformer and the LRA code pad every batch to the task's length,
  so there M is the task's length);
* eps = 1e-6 clamps the denominator from below (``clamp_min``), it is not added;
* the reference takes no padding mask (its ``attn_mask`` only serves ``left_product``, a test);
  ``padding="valid"`` zeroes the features of padded keys, so they leave numerator and denominator
  (outputs at real positions never depend on padded tokens' content; the positions i and M stay
  those of the padded tensor, as in the reference); ``padding="ignore"`` is the reference;
* ``dropout_rate`` is stored but never applied, and there is no probability matrix to drop:
  ``dropout`` is accepted and unused;
* ``act_fun="elu"`` returns ``1 + F.elu`` (a TypeError when called); ``feature_map="elu"`` is the
  evident intent, elu(x) + 1.

Not the Primal-Attention LRA ``attentions/attention_cos.py`` (yingyichen-cyy/PrimalAttention):
that "cos" attention is L2-normalised Q, K scaled by N^(-1/4) each, Q (K^T V) with padded K, V
zeroed and no row normalisation and no re-weighting; no Primal-Attention table has a row for it.
The "Cos." rows of Primal-Attention (UEA Table 1, D4RL Table 5) are the cosFormer numbers of the
Flowformer paper (Wu et al. 2022, reference [11] there), whose runs are not public.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from attnbench.models.attention.base import ProjectedAttention
from attnbench.models.attention.kernels import causal_linear_product
from attnbench.models.attention.registry import Capabilities, register_attention

FEATURE_MAPS = {"relu": F.relu, "elu": lambda x: F.elu(x) + 1.0}
PADDING_MODES = ("valid", "ignore")


class _Reweighted(torch.autograd.Function):
    """(B, H, N, d) features times (..., N, 2, 1) weights -> (B, H, N, 2d), [sin part; cos part]; the
    backward sums the two halves with one multiply-add (autograd would reduce over a dimension of 2)."""

    @staticmethod
    def forward(ctx, phi, weights):
        ctx.save_for_backward(weights)
        return (phi[..., None, :] * weights).flatten(-2)

    @staticmethod
    def backward(ctx, grad):
        (weights,) = ctx.saved_tensors
        halves = grad.unflatten(-1, (2, -1))
        grad_phi = halves[..., 0, :] * weights[..., 0, :]
        return grad_phi.addcmul_(halves[..., 1, :], weights[..., 1, :]), None


@register_attention(
    "cosformer",
    paper="Qin et al. 2022, cosFormer: Rethinking Softmax in Attention (ICLR); code OpenNLPLab/cosFormer",
    equation="Sec. 3.3: s_ij = relu(q_i)^T relu(k_j) cos(pi/2 (i-j)/M), decomposed into sin/cos features",
    capabilities=Capabilities(causal=True, padding_mask=True, cross=False),
)
class CosformerAttention(ProjectedAttention):
    """cosFormer: ReLU linear attention re-weighted by cos(pi/2 (i - j) / M), linear in N."""

    cross_unsupported_reason = ("the re-weighting cos(pi/2 (i-j)/M) compares query and key positions of one "
                                "sequence; the project runs cosFormer as self-attention only")

    def __init__(self, d_model: int, n_heads: int, dropout: float = 0.0, bias: bool = True,
                 feature_map: str = "relu", eps: float = 1e-6, padding: str = "valid", **unused):
        super().__init__(d_model, n_heads, dropout, bias, **unused)
        if feature_map not in FEATURE_MAPS:
            raise ValueError(f"cosformer feature_map must be one of {', '.join(FEATURE_MAPS)}, got {feature_map!r}")
        if padding not in PADDING_MODES:
            raise ValueError(f"cosformer padding must be one of {', '.join(PADDING_MODES)}, got {padding!r}")
        self.feature_map, self.eps, self.padding = feature_map, float(eps), padding

    def extra_repr(self) -> str:
        return f"feature_map={self.feature_map}, eps={self.eps}, padding={self.padding}"

    def reweighted_features(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """[phi(x_i) sin(pi i / 2M); phi(x_i) cos(pi i / 2M)], i = 1..N, M = N (cosformer.py ``get_index``),
        times ``mask`` (B, N) if given: one product of phi(x) with the (N, 2, 1) weights, no concatenation."""
        n = x.shape[2]
        angle = (math.pi / 2) * torch.arange(1, n + 1, device=x.device, dtype=x.dtype) / n
        weights = torch.stack([torch.sin(angle), torch.cos(angle)], dim=-1)[..., None]  # (N, 2, 1)
        if mask is not None:
            weights = weights * mask[:, None, :, None, None].to(x.dtype)  # (B, 1, N, 2, 1)
        return _Reweighted.apply(FEATURE_MAPS[self.feature_map](x), weights)

    def kernel(self, q, k, v, mask, causal):
        q_ = self.reweighted_features(q)
        # padding "valid": padded keys leave numerator and denominator
        k_ = self.reweighted_features(k, mask if self.padding == "valid" else None)
        if causal:
            num = causal_linear_product(q_, k_, v)
            den = torch.einsum("bhnd,bhnd->bhn", q_, k_.cumsum(2))
            return num / den.clamp_min(self.eps)[..., None]
        # numerator and denominator in one product: a column of ones appended to v sums k_
        both = q_ @ (k_.transpose(-1, -2) @ torch.cat([v, torch.ones_like(v[..., :1])], dim=-1))
        return both[..., :-1] / both[..., -1:].clamp_min(self.eps)
