"""Nystromformer attention (Xiong et al. 2021, "Nystromformer: A Nystrom-Based Algorithm for
Approximating Self-Attention").

As the LRA code that produced the published numbers computes it (mlpen/Nystromformer
``LRA/code/attention_nystrom.py``; PrimalAttention_LRA/*/attentions/attention_nystrom.py is the
same file, the PrimalFormer copy reading ``max_seq_len`` where mlpen's reads ``seq_len``). Per
head, with Q and K zeroed at padded positions and both scaled by d^(-1/4):

    Q~, K~  = means of m consecutive segments of Q and K (the landmarks, "segment-means")
    F  = softmax(Q K~^T),  A = softmax(Q~ K~^T),  B = softmax(Q~ K^T - 1e9 (1 - mask))
    out = F A^+ (B V) + conv(V * mask)                  (the paper's Nystrom approximation of softmax(QK^T) V)

A^+ is the iterative Moore-Penrose pseudo-inverse (Razavi et al. 2014, as in the paper's Sec. 3):
Z_{j+1} = 1/4 Z_j (13 I - A Z_j (15 I - A Z_j (7 I - A Z_j))), 6 iterations, from
Z_0 = A^T / max(column sums of A). ``pinv_init="original"`` is the reference's default: the max
is taken over the whole batch and every head, so a sequence's output depends (slightly, through
the unconverged iteration) on the other sequences of its batch; "per_matrix" is the code's
alternative (1 / ||A||_1 per head and sequence; the key it reads, ``inv_init_coeff_option``, is
never set by the LRA configs, so the published runs used "original").
conv is a depthwise convolution along the sequence, one (conv_kernel_size x 1) kernel per head,
zero padding, no bias (the "skip connection" of the LRA code; conv_kernel_size=None disables it).

Lengths: the reference reshapes the padded length n into m segments and therefore needs n to be
a multiple of m (its loader pads to a power of two, which the landmark counts 32-256 divide);
when n equals m it computes exact softmax attention instead. Here an input whose length is not a
multiple of m is right-padded inside the layer with masked positions to the next multiple (to m
when n < m, where the exact-softmax branch applies) and the outputs are cut back to n: exactly the
reference's result on the input padded that far. Padded positions count as zeros in the landmark
means, as in the reference, so a right-padded sequence and the unpadded one generally differ.

The reference applies no attention dropout, so ``dropout`` is accepted and unused.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from attnbench.models.attention.base import ProjectedAttention, depthwise_sequence_conv
from attnbench.models.attention.registry import Capabilities, register_attention

PAPER = "Xiong et al., Nystromformer: A Nystrom-Based Algorithm for Approximating Self-Attention, AAAI 2021"
MASK_PENALTY = 1e9  # attention_nystrom.py: "- 1e9 * (1 - mask[:, None, None, :])"
PINV_INITS = ("original", "per_matrix")


def iterative_pinv(a: torch.Tensor, iterations: int, init: str) -> torch.Tensor:
    """Moore-Penrose pseudo-inverse of the (B, H, m, m) softmax matrices by the iteration above.

    Z_0 = A^T / max_j sum_i A_ij; "original" takes that max over every matrix of the batch
    (attention_nystrom.py, ``torch.max(torch.sum(K, dim = -2))``), "per_matrix" per head and
    sequence (the code's other option)."""
    column_sums = a.sum(dim=-2)
    scale = column_sums.max() if init == "original" else column_sums.amax(dim=-1)[..., None, None]
    z = a.transpose(-1, -2) / scale
    identity = torch.eye(a.shape[-1], dtype=a.dtype, device=a.device)
    for _ in range(iterations):
        az = a @ z
        z = (0.25 * z) @ (13 * identity - az @ (15 * identity - az @ (7 * identity - az)))
    return z


@register_attention(
    "nystromformer",
    paper=PAPER,
    equation="Sec. 3: softmax(Q K~^T) softmax(Q~ K~^T)^+ softmax(Q~ K^T) V, segment-mean landmarks, + conv(V)",
    # segment means mix the whole sequence: not causal; the conv skip adds conv(V) to the outputs
    # position by position, so queries and values must be one sequence: no cross.
    # batch_coupled: the pseudo-inverse starts from the batch-wide max (pinv_init="original", the reference's).
    capabilities=Capabilities(padding_mask=True, batch_coupled=True),
    summary="Nystromformer: segment-mean landmarks, iterative pseudo-inverse, depthwise conv skip on V",
)
class NystromAttention(ProjectedAttention):
    """F A^+ (B V) + conv(V) per head from m segment-mean landmarks (Xiong et al., Sec. 3)."""

    causal_unsupported_reason = (
        "each landmark is the mean of a segment of queries or keys, so every output sees future "
        "tokens through the landmarks (the reference has no causal form)"
    )
    cross_unsupported_reason = (
        "the depthwise convolution skip adds conv(V) to the output position by position, so queries "
        "and values must come from the same sequence"
    )

    def __init__(self, d_model: int, n_heads: int, *, num_landmarks: int = 64, conv_kernel_size: int | None = 35,
                 pinv_iterations: int = 6, pinv_init: str = "original", dropout: float = 0.0, bias: bool = True,
                 **unused):
        super().__init__(d_model, n_heads, dropout, bias, **unused)
        if num_landmarks < 1:
            raise ValueError(f"num_landmarks must be positive, got {num_landmarks}")
        if pinv_init not in PINV_INITS:
            raise ValueError(f"pinv_init must be one of {PINV_INITS}, got {pinv_init!r}")
        if conv_kernel_size is not None and (conv_kernel_size < 1 or conv_kernel_size % 2 == 0):
            # the reference pads by k // 2, so an even k would make conv(V) one position longer than V
            raise ValueError(f"conv_kernel_size must be a positive odd number or None, got {conv_kernel_size}")
        self.num_landmarks = int(num_landmarks)
        self.pinv_iterations = int(pinv_iterations)
        self.pinv_init = pinv_init
        self.conv_kernel_size = conv_kernel_size
        if conv_kernel_size is not None:
            self.conv = nn.Conv2d(n_heads, n_heads, kernel_size=(conv_kernel_size, 1),
                                  padding=(conv_kernel_size // 2, 0), bias=False, groups=n_heads)

    def kernel(self, q, k, v, mask, causal):
        b, h, n, d = q.shape
        m = self.num_landmarks
        padded_n = max(m, -(-n // m) * m)  # a multiple of m (m itself when n <= m)
        keep = torch.ones(b, n, dtype=q.dtype, device=q.device) if mask is None else mask.to(q.dtype)
        if padded_n != n:  # masked right padding, as the reference's loader would have added
            q, k, v = (F.pad(t, (0, 0, 0, padded_n - n)) for t in (q, k, v))
            keep = F.pad(keep, (0, padded_n - n))
        keep_rows = keep[:, None, :, None]
        key_penalty = MASK_PENALTY * (1 - keep[:, None, None, :])
        scaled_keep = keep_rows / d**0.25  # attention_nystrom.py: Q * mask / sqrt(sqrt(head_dim)), one product
        q, k = q * scaled_keep, k * scaled_keep

        if padded_n == m:  # the reference's num_landmarks == seq_len branch: exact softmax
            out = torch.softmax(q @ k.transpose(-1, -2) - key_penalty, dim=-1) @ v
        else:
            q_landmarks = q.reshape(b, h, m, padded_n // m, d).mean(dim=-2)
            k_landmarks = k.reshape(b, h, m, padded_n // m, d).mean(dim=-2)
            kernel_1 = torch.softmax(q @ k_landmarks.transpose(-1, -2), dim=-1)
            kernel_2 = torch.softmax(q_landmarks @ k_landmarks.transpose(-1, -2), dim=-1)
            # products are not kept by autograd (matmul saves its inputs): the mask and the skip go in in place
            kernel_3 = torch.softmax((q_landmarks @ k.transpose(-1, -2)).sub_(key_penalty), dim=-1)
            out = (kernel_1 @ iterative_pinv(kernel_2, self.pinv_iterations, self.pinv_init)) @ (kernel_3 @ v)
        if self.conv_kernel_size is not None:
            out = out.add_(depthwise_sequence_conv(v * keep_rows, self.conv.weight))
        return out[:, :, :n]

    def extra_repr(self) -> str:
        return (f"num_landmarks={self.num_landmarks}, conv_kernel_size={self.conv_kernel_size}, "
                f"pinv_iterations={self.pinv_iterations}, pinv_init={self.pinv_init}")
