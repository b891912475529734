"""Transcription of mlpen/mra-attention ``old_code/LRA/encoders/soft.py`` (SOFT's 1D port):
the computation as that code writes it, on a module's weights (any float dtype; the tests
compare in float64, `attnbench bench --against-reference` times it in float32)."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from attnbench.models.attention.reference.common import linear


def code_newton_inv(mat, max_iter):
    P = mat
    identity = torch.eye(mat.size(-1))
    alpha = 2 / (torch.max(torch.sum(mat, dim=-1)) ** 2)
    beta = 0.5
    V = alpha * P
    pnorm = torch.max(torch.sum(torch.abs(identity - torch.matmul(P, V)), dim=-2))
    err_cnt = 0
    while pnorm > 1.01 and err_cnt < 10:
        alpha *= beta
        V = alpha * P
        pnorm = torch.max(torch.sum(torch.abs(identity - torch.matmul(P, V)), dim=-2))
        err_cnt += 1
    for _ in range(max_iter):
        C = 2 * V - V @ P @ V
        if C.abs().max().item() > 1e4:
            break
        V = C
    return V


def code_soft(m, X, mask=None, max_iter=20):
    b, n, _ = X.shape
    num_head, head_dim = m.n_heads, m.d_head
    mask = torch.ones(b, n) if mask is None else mask.to(X)

    def split_heads(t):
        return t.reshape(t.size(0), t.size(1), num_head, head_dim).transpose(1, 2)

    Q = split_heads(linear(X, m.q_proj)) * mask[:, None, :, None]
    V = split_heads(linear(X, m.v_proj)) * mask[:, None, :, None]
    # SoftmaxFreeAttentionKernel.forward
    Q = Q / math.sqrt(math.sqrt(head_dim))
    num_landmarks = n // m.ratio  # the reference's config num_landmarks (max_seq_len // ratio)
    Q_landmarks = Q.reshape(b * num_head, n, head_dim).transpose(-1, -2)
    Q_landmarks = F.conv1d(Q_landmarks, m.landmark_conv.weight, stride=m.ratio)  # Qlandmark_op
    Q_landmarks = Q_landmarks.transpose(-1, -2).reshape(b, num_head, num_landmarks, head_dim)
    norm = m.landmark_norm
    Q_landmarks = F.gelu(F.layer_norm(Q_landmarks, (head_dim,), norm.weight, norm.bias, norm.eps))  # Qnorm_act
    K_landmarks = Q_landmarks
    kernel_1_ = torch.exp(-(torch.cdist(Q, K_landmarks, p=2) ** 2) / 2)
    kernel_2_ = torch.exp(-(torch.cdist(Q_landmarks, K_landmarks, p=2) ** 2) / 2)
    kernel_3_ = kernel_1_.transpose(-1, -2)
    out = torch.matmul(torch.matmul(kernel_1_, code_newton_inv(kernel_2_, max_iter)), torch.matmul(kernel_3_, V))
    if m.value_conv is not None:
        k = m.value_conv.kernel_size[0]
        out = out + F.conv2d(V, m.value_conv.weight, padding=(k // 2, 0), groups=num_head)
    out = out.transpose(1, 2).reshape(b, n, num_head * head_dim)  # combine_heads
    return linear(out, m.out_proj)  # ff
