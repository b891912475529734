"""SOFT: softmax-free attention (Lu et al., "SOFT: Softmax-free Transformer with Linear Complexity", NeurIPS 2021).

Per head, with shared queries and keys (K = Q = x W_q / d^(1/4)) and the Gaussian kernel
    S(q_i, q_j) = exp(-||q_i - q_j||^2 / 2) = exp(-||x_i W_q - x_j W_q||^2 / (2 sqrt(d)))
SOFT approximates S V through L landmarks Q~ (Nystrom form, symmetric since K = Q):
    Q~ = GELU(LayerNorm(Conv1d_{kernel = stride = r}(Q)))          r = max_len // num_landmarks
    A = S(Q, Q~) (N x L),  B = S(Q~, Q~) (L x L),  out = A B^+ (A^T V)  [+ depthwise conv of V]
with B^+ the Moore-Penrose inverse by Newton iterations V_{k+1} = 2 V_k - V_k B V_k from
V_0 = alpha B, alpha = 2 / max_row_sum(B)^2, halved (at most 10 times) while
max_col_sum|I - B V_0| > 1.01. Equation numbers of the paper were not checked here (the paper
is not in shared/papers).

Reference code. fudan-zvg/SOFT (``models/softmax_free_transformer.py``, ``SoftmaxFreeAttentionKernel``)
is for images only: landmarks by a Conv2d over the sqrt(N) x sqrt(N) patch grid (49 landmarks,
``SoftmaxFreeTrasnformerBlock``: seq_len = 49), a cls token, a 3 x 3 depthwise conv of V
(conv_size=3), ``newton_maxiter: 20`` (config/SOFT_*.yaml). For sequences we follow the 1D port
in the Nystromformer authors' LRA framework, mlpen/mra-attention ``old_code/LRA/encoders/soft.py``
(config ``old_code/LRA/models/soft/64/config.json``): Conv1d landmarks with kernel = stride =
max_seq_len // num_landmarks (num_landmarks 64), LayerNorm + GELU, squared distances by
``torch.cdist(...) ** 2``, conv_kernel_size 0 (33 in ``64-conv``) for a (k x 1) depthwise conv of
V per head, max_iter 20, and the fudan-zvg Newton start with one addition: an iteration whose
result exceeds 1e4 in absolute value stops the loop. Padding there: Q and V are multiplied by the
mask before the kernel (``padding="zero"``, the default; ``"ignore"`` passes the mask over, as
the UEA runs of the Flowformer paper presumably did -- that code is not public). Zeroed Q still
forms landmarks and zero rows of A, so real outputs never depend on padded tokens' content, but
do depend on how many there are. Parameters: W_q, W_v, ff (no W_k), Conv1d d x d x r without
bias, LayerNorm(d), and the conv's heads x k weights.

Like the references, alpha, the halving test and the stopping test take the maximum over the
whole batch and all heads, so one sequence's result can depend on the others in its batch.
``dropout`` is accepted and unused: the reference has no attention dropout (no probabilities).
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn

from attnbench.models.attention.base import AttentionBase, depthwise_sequence_conv, merge_heads, split_heads
from attnbench.models.attention.registry import Capabilities, register_attention

PADDING_MODES = ("zero", "ignore")


def gaussian_kernel(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """exp(-||a_i - b_j||^2 / 2) for a (..., N, d), b (..., L, d), as exp(a.b - |a|^2 / 2 - |b|^2 / 2)
    (fudan-zvg ``subtraction_gaussian_kernel_torch`` expands the square the same way; mlpen's port
    takes ``torch.cdist ** 2``)."""
    half_a = (a * a).sum(-1, keepdim=True) / 2
    half_b = (b * b).sum(-1)[..., None, :] / 2
    # in place in the product, which autograd does not keep (the matmul saves its inputs)
    return (a @ b.transpose(-1, -2)).sub_(half_a).sub_(half_b).exp_()


def newton_pseudo_inverse(mat: torch.Tensor, iterations: int, blowup: float = 1e4) -> torch.Tensor:
    """Moore-Penrose inverse of the symmetric landmark kernels (..., L, L) by Newton iterations,
    as ``SoftmaxFreeAttentionKernel.newton_inv`` (mlpen/mra-attention; the start is fudan-zvg's)."""
    eye = torch.eye(mat.shape[-1], device=mat.device, dtype=mat.dtype)
    alpha = 2 / mat.sum(-1).max() ** 2
    inverse = alpha * mat
    residual = (eye - mat @ inverse).abs().sum(-2).max()
    halvings = 0
    while residual > 1.01 and halvings < 10:  # start small enough for the iteration to converge
        alpha = alpha * 0.5
        inverse = alpha * mat
        residual = (eye - mat @ inverse).abs().sum(-2).max()
        halvings += 1
    flat_mat = mat.reshape(-1, *mat.shape[-2:])
    for _ in range(iterations):
        flat = inverse.reshape(-1, *inverse.shape[-2:])
        step = torch.baddbmm(flat, flat @ flat_mat, flat, beta=2, alpha=-1).view(inverse.shape)  # 2 V - V B V
        if step.abs().max().item() > blowup:  # diverging: keep the last finite iterate
            break
        inverse = step
    return inverse


@register_attention(
    "soft",
    paper="Lu et al. 2021, SOFT: Softmax-free Transformer with Linear Complexity (NeurIPS); "
          "code fudan-zvg/SOFT, 1D port mlpen/mra-attention",
    equation="Gaussian kernel exp(-||q_i - q_j||^2 / (2 sqrt d)), K = Q; Nystrom A B^+ A^T V, B^+ by Newton iterations",
    # batch_coupled: the Newton start and stopping tests take maxima over the whole batch (as the references).
    capabilities=Capabilities(causal=False, padding_mask=True, cross=False, sized_by_max_len=True, batch_coupled=True),
)
class SoftAttention(AttentionBase):
    """SOFT: Gaussian-kernel attention with shared Q = K, conv landmarks and a Newton pseudo-inverse."""

    causal_unsupported_reason = ("the landmarks pool queries over the whole sequence and B^+ mixes all landmarks, "
                                 "so every output sees future tokens; the reference code has no causal form")
    cross_unsupported_reason = "keys are the queries themselves (K = Q): there is no second sequence to attend to"

    def __init__(self, d_model: int, n_heads: int, dropout: float = 0.0, bias: bool = True,
                 num_landmarks: int = 64, max_len: int | None = None, conv_kernel_size: int = 0,
                 newton_iterations: int = 20, padding: str = "zero", **unused):
        super().__init__(d_model, n_heads, dropout, bias, **unused)
        if num_landmarks < 1:
            raise ValueError(f"soft num_landmarks must be positive, got {num_landmarks}")
        if conv_kernel_size < 0 or (conv_kernel_size and conv_kernel_size % 2 == 0):
            raise ValueError(f"soft conv_kernel_size must be 0 (no conv) or odd, got {conv_kernel_size}")
        if padding not in PADDING_MODES:
            raise ValueError(f"soft padding must be one of {', '.join(PADDING_MODES)}, got {padding!r}")
        self.num_landmarks, self.max_len = num_landmarks, max_len
        self.newton_iterations, self.padding = newton_iterations, padding
        # mlpen: ratio = max_seq_len // num_landmarks; at least 1 (a task shorter than num_landmarks,
        # e.g. UEA JapaneseVowels, N = 29, where the reference's kernel_size=0 cannot be built;
        # without a max_len, outside a task, every token is its own window)
        self.ratio = max(1, (max_len or 0) // num_landmarks)
        d = self.d_head
        self.q_proj = nn.Linear(d_model, d_model, bias=bias)  # W_q
        self.v_proj = nn.Linear(d_model, d_model, bias=bias)  # W_v
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)  # ff
        self.landmark_conv = nn.Conv1d(d, d, kernel_size=self.ratio, stride=self.ratio, bias=False)  # Qlandmark_op
        self.landmark_norm = nn.LayerNorm(d)  # Qnorm_act = LayerNorm + GELU
        self.value_conv = None
        if conv_kernel_size:  # depthwise (k x 1) conv of V along the sequence, one kernel per head
            self.value_conv = nn.Conv2d(n_heads, n_heads, kernel_size=(conv_kernel_size, 1),
                                        padding=(conv_kernel_size // 2, 0), groups=n_heads, bias=False)

    def extra_repr(self) -> str:
        return (f"num_landmarks={self.num_landmarks}, max_len={self.max_len}, ratio={self.ratio}, "
                f"newton_iterations={self.newton_iterations}, padding={self.padding}")

    def landmarks(self, q: torch.Tensor) -> torch.Tensor:
        """(B, H, N, d) -> (B, H, N // ratio, d): strided conv over windows of ``ratio`` tokens, LN, GELU."""
        b, h, n, d = q.shape
        r = self.ratio
        if n < r:
            raise ValueError(f"soft: sequence of {n} tokens is shorter than one landmark window ({r} = "
                             f"max_len {self.max_len} // num_landmarks {self.num_landmarks})")
        # the conv's windows do not overlap (kernel = stride = r; a last partial window is dropped):
        # one matmul of each window's r x d values with the weight as (r d) x d
        windows = q[:, :, :n // r * r].reshape(b, h, n // r, r * d)
        weight = self.landmark_conv.weight.permute(2, 1, 0).reshape(r * d, d)  # (out, in, r) -> (r in, out)
        return nn.functional.gelu(self.landmark_norm(windows @ weight))

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None, causal: bool = False,
                context: torch.Tensor | None = None, context_mask: torch.Tensor | None = None) -> torch.Tensor:
        self.key_source(x, mask, causal, context, context_mask)  # refuses a context
        self.check_causal(causal)
        q = split_heads(self.q_proj(x), self.n_heads)
        v = split_heads(self.v_proj(x), self.n_heads)
        scale = 1 / math.sqrt(math.sqrt(self.d_head))  # K = Q: ||q_i - q_j||^2 / sqrt(d) in the exponent
        if mask is not None and self.padding == "zero":
            weight = mask[:, None, :, None].to(q.dtype)
            q, v = q * (weight * scale), v * weight  # mlpen SoftmaxFreeAttention.forward
        else:
            q = q * scale
        q_landmarks = self.landmarks(q)
        to_landmarks = gaussian_kernel(q, q_landmarks)  # A, (B, H, N, L)
        among_landmarks = gaussian_kernel(q_landmarks, q_landmarks)  # B, (B, H, L, L)
        out = (to_landmarks @ newton_pseudo_inverse(among_landmarks, self.newton_iterations)) @ (
            to_landmarks.transpose(-1, -2) @ v)
        if self.value_conv is not None:
            out = out + depthwise_sequence_conv(v, self.value_conv.weight)
        return self.out_proj(merge_heads(out))
