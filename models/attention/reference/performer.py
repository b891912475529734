"""Transcription of mlpen/Nystromformer LRA/code/attention.py ``Attention`` + attention_performer.py calling
lucidrains/performer-pytorch FastAttention as of early 2021:
the computation as that code writes it, on a module's weights (any float dtype; the tests
compare in float64, `attnbench bench --against-reference` times it in float32)."""
from __future__ import annotations

import math

import torch


def code_attention(m, x, mask, causal=False, context=None, context_mask=None):
    """attention.py Attention.forward around PerformerAttention (keys/values from ``context`` if
    given, as performer-pytorch's SelfAttention does for cross-attention)."""
    source = x if context is None else context
    key_mask = mask if context is None else context_mask

    def split_heads(t):
        return t.reshape(t.shape[0], t.shape[1], m.n_heads, m.d_head).transpose(1, 2)

    q = split_heads(x @ m.q_proj.weight.T + m.q_proj.bias)
    k = split_heads(source @ m.k_proj.weight.T + m.k_proj.bias)
    v = split_heads(source @ m.v_proj.weight.T + m.v_proj.bias)
    out = code_performer(m, q, k, v, key_mask.to(x.dtype), causal)
    out = out.transpose(1, 2).reshape(x.shape[0], x.shape[1], m.n_heads * m.d_head)
    return out @ m.out_proj.weight.T + m.out_proj.bias


def code_performer(m, Q, K, V, mask, causal):
    """attention_performer.py PerformerAttention.forward -> FastAttention.forward."""
    head_dim = m.d_head
    q = Q / math.sqrt(math.sqrt(head_dim))
    k = K / math.sqrt(math.sqrt(head_dim)) * mask[:, None, :, None]
    v = V * mask[:, None, :, None]
    if m.feature_map == "softmax":
        q = code_softmax_kernel(q, m.projection, is_query=True)
        k = code_softmax_kernel(k, m.projection, is_query=False, key_max=not causal)
    else:
        q, k = code_generalized_kernel(q, m.projection), code_generalized_kernel(k, m.projection)
    return code_causal_linear_attention(q, k, v) if causal else code_linear_attention(q, k, v)


def code_softmax_kernel(data, projection_matrix, is_query, key_max=True, eps=1e-4):
    """performer_pytorch.softmax_kernel (before commit 08525a4). ``key_max=False``: the causal form
    here subtracts nothing from key features (documented deviation: the max would see the future)."""
    b, h = data.shape[:2]
    data_normalizer = data.shape[-1] ** -0.25
    ratio = projection_matrix.shape[0] ** -0.5
    projection = projection_matrix.expand(b, h, *projection_matrix.shape)  # repeat 'j d -> b h j d'
    data_dash = torch.einsum("...id,...jd->...ij", data_normalizer * data, projection)
    diag_data = (torch.sum(data**2, dim=-1) / 2.0 * data_normalizer**2).unsqueeze(dim=-1)
    if is_query:
        return ratio * (torch.exp(data_dash - diag_data - torch.max(data_dash, dim=-1, keepdim=True).values) + eps)
    return ratio * (torch.exp(data_dash - diag_data - (torch.max(data_dash) if key_max else 0)) + eps)


def code_generalized_kernel(data, projection_matrix, kernel_epsilon=0.001):
    b, h = data.shape[:2]
    projection = projection_matrix.expand(b, h, *projection_matrix.shape)
    data_dash = torch.einsum("...id,...jd->...ij", data.shape[-1] ** -0.25 * data, projection)
    return torch.relu(data_dash) + kernel_epsilon


def code_linear_attention(q, k, v):
    k_cumsum = k.sum(dim=-2)
    D_inv = 1.0 / torch.einsum("...nd,...d->...n", q, k_cumsum)
    context = torch.einsum("...nd,...ne->...de", k, v)
    return torch.einsum("...de,...nd,...n->...ne", context, q, D_inv)


def code_causal_linear_attention(q, k, v, eps=1e-6):
    """causal_linear_attention_noncuda without chunks (the CUDA kernel computes the same)."""
    k_cumsum = k.cumsum(dim=-2)
    D_inv = 1.0 / torch.einsum("...nd,...nd->...n", q, k_cumsum + eps)
    context = torch.einsum("...nd,...ne->...nde", k, v).cumsum(dim=-3)
    return torch.einsum("...nde,...nd,...n->...ne", context, q, D_inv)


def code_gaussian_orthogonal_random_matrix(nb_rows, nb_columns, generator):
    """performer_pytorch.gaussian_orthogonal_random_matrix(scaling = 0), torch.randn drawing from ``generator``."""
    block_list = []
    for _ in range(int(nb_rows / nb_columns)):
        q, r = torch.linalg.qr(torch.randn((nb_columns, nb_columns), generator=generator), mode="reduced")
        block_list.append(q.t())
    remaining_rows = nb_rows - int(nb_rows / nb_columns) * nb_columns
    if remaining_rows > 0:
        q, r = torch.linalg.qr(torch.randn((nb_columns, nb_columns), generator=generator), mode="reduced")
        block_list.append(q.t()[:remaining_rows])
    final_matrix = torch.cat(block_list)
    multiplier = torch.randn((nb_rows, nb_columns), generator=generator).norm(dim=1)
    return torch.diag(multiplier) @ final_matrix
