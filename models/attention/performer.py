"""Performer attention, FAVOR+ (Choromanski et al. 2021, "Rethinking Attention with Performers").

As the LRA code that produced the published numbers computes it: mlpen/Nystromformer
``LRA/code/attention_performer.py`` (identical in PrimalAttention_LRA/*/attentions/) wraps
lucidrains/performer-pytorch's ``FastAttention(dim_heads, nb_features, causal=False, kernel_fn=...)``:

    q' = Q / d^(1/4),   k' = K / d^(1/4) * mask,   v' = V * mask           (the LRA wrapper)
    phi(x) = m^(-1/2) (exp(w_r . x/d^(1/4) - |x|^2 / (2 sqrt(d)) - c) + 1e-4)_{r=1..m}
                                                          (softmax_kernel: positive random features)
    out_i = phi(q'_i)^T sum_j phi(k'_j) v'_j  /  phi(q'_i)^T sum_j phi(k'_j)    (linear_attention)

with w_r the rows of an orthogonal Gaussian random matrix (m x d; blocks of d orthonormal rows
from QR, each row rescaled by the norm of a Gaussian vector: gaussian_orthogonal_random_matrix
with scaling 0). Since softmax_kernel scales by d^(-1/4) again, the kernel estimated is
exp(q . k / d), not exp(q . k / sqrt(d)). The stabiliser c is, for a query, the max of its own
features; for keys, the max over ALL features of all keys of the batch (performer-pytorch as in
early 2021; commit 08525a4 of Oct 2021 made it per sequence and head). c cancels between numerator
and denominator except through the +1e-4, so it only shifts that term.

Feature map: the LRA config says ``kernel_type: relu``, but FastAttention uses ``kernel_fn`` only
with ``generalized_attention=True``, which the wrapper does not pass: the published runs used the
softmax (positive exponential) features above for "relu" and "exp" alike. ``feature_map="softmax"``
is that; ``feature_map="relu"`` is the generalized kernel the config name meant,
phi(x) = relu(w_r . x/d^(1/4)) + 1e-3 (generalized_kernel).

Padding: as the wrapper (``padded_keys="zeroed"``), padded keys are zeroed, not removed: each
still enters the denominator with phi(0), i.e. like a key of logit q . 0 = 0 with a zero value.
Real outputs do not depend on padded content, but a right-padded sequence and the unpadded one
differ (noticeably when many positions are padded, as in LRA's 2048/4096-token rows).
``padded_keys="excluded"`` zeroes the features of padded keys (and takes the keys' max over real
keys only), so padding changes nothing: the Performer paper's attention over the real tokens.

Causal (performer-pytorch's causal_linear_attention): prefix sums, out_i = phi(q'_i)^T
sum_{j<=i} phi(k'_j) v'_j / phi(q'_i)^T (sum_{j<=i} phi(k'_j) + 1e-6) (the +1e-6 performer-pytorch added in
April 2021, commit dc85b33; no published table is causal), computed chunk-wise. The
keys' batch-wide max would let future keys change past outputs (through the +1e-4), so causally
the keys' stabiliser is c = 0 (w_r . x - |x|^2/2 <= |w_r|^2/2, so exp cannot overflow).

Random features: drawn when the module is built, from a generator seeded by ``feature_seed``
(default: drawn from torch's global RNG, so a seeded run is reproducible). FastAttention never
redraws; ``redraw_interval=k > 0`` draws a new matrix before training forward passes k+1, 2k+1, ...
(draw r from seed f(feature_seed, r); evaluation passes neither count nor redraw). Counters and the
matrix are buffers, so a checkpoint resumes the same sequence of draws.

The reference applies no attention dropout, so ``dropout`` is accepted and unused.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from attnbench.models.attention.base import ProjectedAttention
from attnbench.models.attention.kernels import causal_linear_product
from attnbench.models.attention.registry import Capabilities, register_attention

PAPER = "Choromanski et al., Rethinking Attention with Performers, ICLR 2021 (LRA code: mlpen/Nystromformer)"
FEATURE_MAPS = ("softmax", "relu")
PADDED_KEYS = ("zeroed", "excluded")
SOFTMAX_FEATURE_EPS = 1e-4  # softmax_kernel(..., eps=1e-4)
RELU_FEATURE_EPS = 1e-3  # generalized_kernel(..., kernel_epsilon=0.001)
CAUSAL_DENOMINATOR_EPS = 1e-6  # causal_linear_attention(..., eps=1e-6): k.cumsum(dim=-2) + eps
_SEED_STRIDE = 0x9E3779B97F4A7C15  # odd 64-bit constant (splitmix64) spreading draw r's seed


def orthogonal_gaussian_matrix(n_rows: int, n_cols: int, generator: torch.Generator,
                               dtype=None) -> torch.Tensor:
    """performer-pytorch's gaussian_orthogonal_random_matrix(scaling=0): stacked blocks of
    n_cols orthonormal rows (Q^T of the QR of a Gaussian matrix; the last block cut to the
    remaining rows), row r multiplied by the norm of a Gaussian n_cols-vector (Performer Sec. 2.4)."""
    blocks = []
    for start in range(0, n_rows, n_cols):
        gaussian = torch.randn(n_cols, n_cols, generator=generator, dtype=dtype)
        q, _ = torch.linalg.qr(gaussian, mode="reduced")
        blocks.append(q.T[: n_rows - start])
    norms = torch.randn(n_rows, n_cols, generator=generator, dtype=dtype).norm(dim=1)
    return norms[:, None] * torch.cat(blocks)


class _SoftmaxFeatures(torch.autograd.Function):
    """exp(projected - offset - c) + floor with its exact gradient, without autograd's N x m
    temporaries. c is the stabiliser (``shift``): "row" the max of each row of ``projected``, "batch_max"
    the max over all of it (over the ``valid`` (B, N) keys only, if given; 0 when there are none),
    "zero" none; its gradient goes to the element that is the max (the first of equal ones)."""

    @staticmethod
    def forward(ctx, projected, offset, shift, valid, floor):
        index = found = None
        if shift == "row":
            c, index = projected.max(dim=-1, keepdim=True)
        elif shift == "batch_max":
            source = projected if valid is None else projected.masked_fill(~valid[:, None, :, None], float("-inf"))
            index = source.argmax().view(1)  # a 1-element index (a 0-d one would be read on the host)
            c = source.view(-1).gather(0, index).view(())
            found = torch.isfinite(c)  # False: no real key at all, c = 0 (read on the device, no sync)
            c = torch.where(found, c, torch.zeros_like(c))
        else:
            c = 0.0
        exponential = (projected - (offset + c)).exp_()
        ctx.save_for_backward(exponential, index, found)
        ctx.shift = shift
        return exponential + floor

    @staticmethod
    def backward(ctx, grad):
        exponential, index, found = ctx.saved_tensors
        grad_projected = (grad * exponential).contiguous()
        row_sums = grad_projected.sum(-1, keepdim=True)  # = -d/d(offset + c) of each row
        if ctx.shift == "row":
            grad_projected.scatter_add_(-1, index, -row_sums)
        elif ctx.shift == "batch_max":
            grad_projected.view(-1).index_add_(0, index, -(row_sums.sum() * found).view(1))
        return grad_projected, -row_sums, None, None, None


def softmax_features(x: torch.Tensor, projection: torch.Tensor, is_query: bool, key_shift: str,
                     valid: torch.Tensor | None = None) -> torch.Tensor:
    """Positive random features of exp(x . y) (performer-pytorch softmax_kernel; Performer Lemma 1):
    ratio (exp(w_r . x' - |x'|^2 / 2 - c) + eps) with x' = x d^(-1/4), ratio = m^(-1/2) folded into
    the exponent. ``key_shift``: "batch_max" (the reference: max over every key feature of the
    batch; over the ``valid`` (B, N) keys only, if given) or "zero"."""
    normalizer = x.shape[-1] ** -0.25
    ratio = projection.shape[0] ** -0.5
    projected = x @ (normalizer * projection).T
    offset = (x * x).sum(-1, keepdim=True) * (normalizer**2 / 2.0) - math.log(ratio)
    shift = "row" if is_query else key_shift
    return _SoftmaxFeatures.apply(projected, offset, shift, valid, ratio * SOFTMAX_FEATURE_EPS)


def relu_features(x: torch.Tensor, projection: torch.Tensor) -> torch.Tensor:
    """performer-pytorch generalized_kernel with kernel_fn = ReLU (Performer Sec. 2.3, FAVOR+ ReLU)."""
    projected = x @ (x.shape[-1] ** -0.25 * projection).T
    return F.relu(projected) + RELU_FEATURE_EPS


def linear_attention(phi_q: torch.Tensor, phi_k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """performer-pytorch linear_attention: phi(q)^T (sum_j phi(k_j) v_j^T) / phi(q)^T sum_j phi(k_j), the
    denominator through a column of ones appended to v (one product for both)."""
    context = phi_k.transpose(-1, -2) @ torch.cat([v, torch.ones_like(v[..., :1])], dim=-1)
    both = phi_q @ context
    normalizer = both[..., -1:]
    # normalizer > 0 (positive features), except with every key excluded: then the output is 0
    normalizer = torch.where(normalizer > 0, normalizer, torch.ones_like(normalizer))
    return both[..., :-1] / normalizer


def causal_linear_attention(phi_q: torch.Tensor, phi_k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """performer-pytorch causal_linear_attention: phi(q_i) . sum_{j<=i} phi(k_j) v_j^T over
    phi(q_i) . (sum_{j<=i} phi(k_j) + eps), one chunked prefix-sum product (numerator and, through a
    column of ones appended to v, the denominator)."""
    ones = torch.ones_like(v[..., :1])
    both = causal_linear_product(phi_q, phi_k, torch.cat([v, ones], dim=-1))
    denominator = both[..., -1] + CAUSAL_DENOMINATOR_EPS * phi_q.sum(-1)  # phi(q) . (k_cumsum + eps)
    return both[..., :-1] / denominator[..., None]


@register_attention(
    "performer",
    paper=PAPER,
    equation="FAVOR+ (Sec. 2.3-2.4: positive orthogonal random features, Lemma 1)",
    # features of any key set; prefix sums causally; batch_coupled: the keys' stabiliser is the max over
    # the whole batch (performer-pytorch as the LRA code ran it), bidirectionally
    capabilities=Capabilities(causal=True, padding_mask=True, cross=True, batch_coupled=True),
    summary="Performer FAVOR+: positive orthogonal random features, linear attention",
)
class PerformerAttention(ProjectedAttention):
    """phi(Q) (phi(K)^T V) / phi(Q) phi(K)^T 1 with orthogonal random features (Performer FAVOR+)."""

    def __init__(self, d_model: int, n_heads: int, *, nb_features: int = 256, feature_map: str = "softmax",
                 padded_keys: str = "zeroed", redraw_interval: int = 0, feature_seed: int | None = None,
                 dropout: float = 0.0, bias: bool = True, **unused):
        super().__init__(d_model, n_heads, dropout, bias, **unused)
        if feature_map not in FEATURE_MAPS:
            raise ValueError(f"feature_map must be one of {FEATURE_MAPS}, got {feature_map!r}")
        if padded_keys not in PADDED_KEYS:
            raise ValueError(f"padded_keys must be one of {PADDED_KEYS}, got {padded_keys!r}")
        self.padded_keys = padded_keys
        if nb_features < 1 or redraw_interval < 0:
            raise ValueError(f"nb_features must be positive and redraw_interval >= 0, "
                             f"got {nb_features}, {redraw_interval}")
        self.nb_features, self.feature_map, self.redraw_interval = int(nb_features), feature_map, int(redraw_interval)
        if feature_seed is None:
            feature_seed = int(torch.randint(0, 2**62, ()).item())
        self.register_buffer("feature_seed", torch.tensor(int(feature_seed), dtype=torch.long))
        self.register_buffer("draws", torch.tensor(0, dtype=torch.long))  # index of the current matrix
        self.register_buffer("training_passes", torch.tensor(0, dtype=torch.long))
        self.register_buffer("projection", self._draw(0, torch.get_default_dtype()))

    def _draw(self, index: int, dtype) -> torch.Tensor:
        """Random matrix number ``index`` of this module: a function of (feature_seed, index) only."""
        seed = (int(self.feature_seed) + index * _SEED_STRIDE) % 2**63
        generator = torch.Generator().manual_seed(seed)
        return orthogonal_gaussian_matrix(self.nb_features, self.d_head, generator, dtype)

    @torch.no_grad()
    def redraw_projection(self) -> None:
        """Replace the random features by the next draw of this module's seeded sequence."""
        self.draws += 1
        matrix = self._draw(int(self.draws), self.projection.dtype)
        self.projection.copy_(matrix.to(self.projection.device))

    def _count_training_pass(self) -> None:
        if not self.training or self.redraw_interval == 0:
            return
        if int(self.training_passes) > 0 and int(self.training_passes) % self.redraw_interval == 0:
            self.redraw_projection()
        self.training_passes += 1

    def forward(self, x, mask=None, causal=False, context=None, context_mask=None):
        self._count_training_pass()
        return super().forward(x, mask, causal, context, context_mask)

    def kernel(self, q, k, v, mask, causal):
        d = q.shape[-1]
        q = q / d**0.25  # attention_performer.py: Q / sqrt(sqrt(head_dim))
        k = k / d**0.25
        keep = None if mask is None else mask[:, None, :, None].to(k.dtype)
        if keep is not None:  # K * mask, V * mask: padded keys become zero vectors
            k, v = k * keep, v * keep
        excluded = self.padded_keys == "excluded" and mask is not None
        projection = self.projection.to(q.dtype)
        if self.feature_map == "softmax":
            phi_q = softmax_features(q, projection, is_query=True, key_shift="batch_max")
            phi_k = softmax_features(k, projection, is_query=False, key_shift="zero" if causal else "batch_max",
                                     valid=mask if excluded else None)
        else:
            phi_q, phi_k = relu_features(q, projection), relu_features(k, projection)
        if excluded:
            phi_k = phi_k * keep
        if causal:
            return causal_linear_attention(phi_q, phi_k, v)
        return linear_attention(phi_q, phi_k, v)

    def extra_repr(self) -> str:
        return (f"nb_features={self.nb_features}, feature_map={self.feature_map}, "
                f"padded_keys={self.padded_keys}, redraw_interval={self.redraw_interval}")
