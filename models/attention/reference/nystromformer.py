"""Transcription of mlpen/Nystromformer LRA/code/attention.py ``Attention`` + attention_nystrom.py:
the computation as that code writes it, on a module's weights (any float dtype; the tests
compare in float64, `attnbench bench --against-reference` times it in float32)."""
from __future__ import annotations

import math

import torch


def code_attention(m, x, mask):
    """attention.py Attention.forward: W_q/W_k/W_v, split_heads, attn(Q, K, V, mask.float()), ff."""
    b, n, _ = x.shape

    def split_heads(t):
        return t.reshape(b, n, m.n_heads, m.d_head).transpose(1, 2)

    q = split_heads(x @ m.q_proj.weight.T + m.q_proj.bias)
    k = split_heads(x @ m.k_proj.weight.T + m.k_proj.bias)
    v = split_heads(x @ m.v_proj.weight.T + m.v_proj.bias)
    out = code_nystrom(m, q, k, v, mask.to(x.dtype), seq_len=n)
    out = out.transpose(1, 2).reshape(b, n, m.n_heads * m.d_head)
    return out @ m.out_proj.weight.T + m.out_proj.bias


def code_nystrom(m, Q, K, V, mask, seq_len):
    """attention_nystrom.py NystromAttention.forward; seq_len = the padded length (max_seq_len)."""
    num_head, head_dim, num_landmarks = m.n_heads, m.d_head, m.num_landmarks
    Q = Q * mask[:, None, :, None] / math.sqrt(math.sqrt(head_dim))
    K = K * mask[:, None, :, None] / math.sqrt(math.sqrt(head_dim))
    if num_landmarks == seq_len:
        attn = torch.softmax(torch.matmul(Q, K.transpose(-1, -2)) - 1e9 * (1 - mask[:, None, None, :]), dim=-1)
        X = torch.matmul(attn, V)
    else:
        Q_landmarks = Q.reshape(-1, num_head, num_landmarks, seq_len // num_landmarks, head_dim).mean(dim=-2)
        K_landmarks = K.reshape(-1, num_head, num_landmarks, seq_len // num_landmarks, head_dim).mean(dim=-2)
        kernel_1 = torch.softmax(torch.matmul(Q, K_landmarks.transpose(-1, -2)), dim=-1)
        kernel_2 = torch.softmax(torch.matmul(Q_landmarks, K_landmarks.transpose(-1, -2)), dim=-1)
        kernel_3 = torch.softmax(torch.matmul(Q_landmarks, K.transpose(-1, -2))
                                 - 1e9 * (1 - mask[:, None, None, :]), dim=-1)
        X = torch.matmul(torch.matmul(kernel_1, code_iterative_inv(kernel_2, m.pinv_init)), torch.matmul(kernel_3, V))
    if m.conv_kernel_size is not None:
        X = X + m.conv(V * mask[:, None, :, None])  # nn.Conv2d(num_head, num_head, (k, 1), padding=(k//2, 0), groups)
    return X


def code_iterative_inv(mat, init_option, n_iter=6):
    identity = torch.eye(mat.size(-1))
    K = mat
    if init_option == "original":
        V = 1 / torch.max(torch.sum(K, dim=-2)) * K.transpose(-1, -2)
    else:
        V = 1 / torch.max(torch.sum(K, dim=-2), dim=-1).values[:, :, None, None] * K.transpose(-1, -2)
    for _ in range(n_iter):
        KV = torch.matmul(K, V)
        V = torch.matmul(0.25 * V,
                         13 * identity - torch.matmul(KV, 15 * identity - torch.matmul(KV, 7 * identity - KV)))
    return V
