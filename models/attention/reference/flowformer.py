"""Transcription of every family of thuml/Flowformer (TimeSeries, Flow_Attention.py, LRA, RL, NLP):
the computation as that code writes it, on a module's weights (any float dtype; the tests
compare in float64, `attnbench bench --against-reference` times it in float32)."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from attnbench.models.attention.reference.common import linear


def projected(m, x):
    """AttentionLayer.forward / Flow_Attention.forward step 1: (B, L, H, D) projections."""
    b, n, _ = x.shape
    h = m.n_heads
    return tuple(linear(x, lin).view(b, n, h, -1) for lin in (m.q_proj, m.k_proj, m.v_proj))


def code_timeseries(m, x):
    queries, keys, values = projected(m, x)
    queries, keys, values = queries.transpose(1, 2), keys.transpose(1, 2), values.transpose(1, 2)
    queries, keys = torch.sigmoid(queries), torch.sigmoid(keys)
    normalizer_row = 1.0 / (torch.einsum("nhld,nhd->nhl", queries + 1e-6, keys.sum(dim=2) + 1e-6))
    normalizer_col = 1.0 / (torch.einsum("nhsd,nhd->nhs", keys + 1e-6, queries.sum(dim=2) + 1e-6))
    normalizer_row_refine = torch.einsum("nhld,nhd->nhl", queries + 1e-6,
                                         (keys * normalizer_col[:, :, :, None]).sum(dim=2) + 1e-6)
    normalizer_col_refine = torch.einsum("nhsd,nhd->nhs", keys + 1e-6,
                                         (queries * normalizer_row[:, :, :, None]).sum(dim=2) + 1e-6)
    normalizer_row_refine = torch.sigmoid(normalizer_row_refine * (float(queries.shape[2]) / float(keys.shape[2])))
    normalizer_col_refine = torch.softmax(normalizer_col_refine, dim=-1) * keys.shape[2]
    kv = keys.transpose(-2, -1) @ (values * normalizer_col_refine[:, :, :, None])
    out = (((queries @ kv) * normalizer_row[:, :, :, None]) * normalizer_row_refine[:, :, :, None]).transpose(1, 2)
    return linear(out.reshape(x.shape[0], x.shape[1], -1), m.out_proj)


def code_core(m, x, eps=1e-6, clamp=1.0):
    queries, keys, values = (t.transpose(1, 2) for t in projected(m, x))
    queries, keys = torch.sigmoid(queries), torch.sigmoid(keys)
    sink_incoming = 1.0 / (torch.einsum("nhld,nhd->nhl", queries + eps, keys.sum(dim=2) + eps))
    source_outgoing = 1.0 / (torch.einsum("nhld,nhd->nhl", keys + eps, queries.sum(dim=2) + eps))
    conserved_sink = torch.einsum("nhld,nhd->nhl", queries + eps,
                                  (keys * source_outgoing[:, :, :, None]).sum(dim=2) + eps)
    conserved_source = torch.einsum("nhld,nhd->nhl", keys + eps,
                                    (queries * sink_incoming[:, :, :, None]).sum(dim=2) + eps)
    conserved_source = torch.clamp(conserved_source, min=-clamp, max=clamp)
    sink_allocation = torch.sigmoid(conserved_sink * (float(queries.shape[2]) / float(keys.shape[2])))
    source_competition = torch.softmax(conserved_source, dim=-1) * float(keys.shape[2])
    kv = torch.einsum("nhld,nhlm->nhdm", keys, values * source_competition[:, :, :, None])
    qkv = torch.einsum("nhld,nhdm->nhlm", queries * sink_incoming[:, :, :, None], kv)
    out = (qkv * sink_allocation[:, :, :, None]).transpose(1, 2)
    return linear(out.reshape(x.shape[0], x.shape[1], -1), m.out_proj)


def code_lra(m, x, eps=1e-6):
    query, key, value = projected(m, x)  # DenseGeneral features=(num_heads, head_dim): [b, l, h, d]
    query_mapped, key_mapped = F.relu(query) + 1e-6, F.relu(key) + 1e-6
    sink_incoming = 1.0 / torch.einsum("nlhd,nhd->nlh", query_mapped + eps, key_mapped.sum(1) + eps)
    source_outgoing = 1.0 / torch.einsum("nshd,nhd->nsh", key_mapped + eps, query_mapped.sum(1) + eps)
    conserved_sink = torch.einsum("nlhd,nhd->nlh", query_mapped + eps,
                                  (key_mapped * source_outgoing[:, :, :, None]).sum(1) + eps)
    conserved_source = torch.einsum("nshd,nhd->nsh", key_mapped + eps,
                                    (query_mapped * sink_incoming[:, :, :, None]).sum(1) + eps)
    sink_allocation = torch.sigmoid(conserved_sink * (float(query_mapped.shape[1]) / float(key_mapped.shape[1])))
    source_competition = torch.softmax(conserved_source, dim=-1) * key_mapped.shape[1]  # softmax over heads
    kv = torch.einsum("nshd,nshm->nhdm", key_mapped, value * source_competition[:, :, :, None])
    y = torch.einsum("nlhd,nhdm->nlhm", query_mapped, kv)
    y = (y * sink_incoming[:, :, :, None]) * sink_allocation[:, :, :, None]
    return linear(y.reshape(x.shape[0], x.shape[1], -1), m.out_proj)  # out DenseGeneral over axis (-2, -1)


def code_rl_causal(m, x, eps=1e-6, clamp=10.0):
    queries, keys, values = (t.transpose(1, 2) for t in projected(m, x))
    queries, keys = torch.sigmoid(queries), torch.sigmoid(keys)
    sink_incoming = 1.0 / (torch.einsum("nhld,nhld->nhl", queries + eps, keys.cumsum(dim=2) + eps))
    source_outgoing = 1.0 / (torch.einsum("nhld,nhld->nhl", keys + eps, queries.cumsum(dim=2) + eps))
    normal = (torch.arange(queries.shape[2]).to(x) + 1.0)[None, None, :]
    sink_incoming = sink_incoming * normal
    source_outgoing = source_outgoing * normal
    conserved_sink = torch.einsum("nhld,nhld->nhl", queries + eps,
                                  (keys * source_outgoing[:, :, :, None]).cumsum(dim=2) + eps) / normal
    conserved_source = torch.einsum("nhld,nhld->nhl", keys + eps,
                                    (queries * sink_incoming[:, :, :, None]).cumsum(dim=2) + eps) / normal
    conserved_source = torch.clamp(conserved_source, min=-clamp, max=clamp)
    sink_allocation = torch.sigmoid(conserved_sink)
    conserved_source = torch.exp(conserved_source)
    source_competition = (conserved_source / conserved_source.cumsum(dim=-1)) * normal
    kv = torch.einsum("nhld,nhlm->nhldm", keys, values * source_competition[:, :, :, None]).cumsum(dim=2)
    qkv = torch.einsum("nhld,nhldm->nhlm", queries * (sink_incoming[:, :, :, None] / normal[:, :, :, None]), kv)
    out = (qkv * sink_allocation[:, :, :, None]).transpose(1, 2)
    return linear(out.reshape(x.shape[0], x.shape[1], -1), m.out_proj)


def code_nlp_causal(m, x):
    query = x.transpose(0, 1)  # Time x Batch x Channel
    tgt_len, bsz, embed_dim = query.size()
    h, head_dim = m.n_heads, embed_dim // m.n_heads
    q, k, v = (linear(query, lin).contiguous().view(tgt_len, bsz * h, head_dim).transpose(0, 1)
               for lin in (m.q_proj, m.k_proj, m.v_proj))
    q, k = torch.sigmoid(q), torch.sigmoid(k)
    sink_incoming = 1.0 / (torch.einsum("nld,nld->nl", q + 1e-6, k.cumsum(dim=1) + 1e-6))
    sink_incoming_keep = sink_incoming
    source_outgoing = 1.0 / (torch.einsum("nld,nld->nl", k + 1e-6, q.cumsum(dim=1) + 1e-6))
    normal = (torch.arange(q.shape[1]).to(x) + 1.0)[None, :]
    sink_incoming = sink_incoming * normal
    source_outgoing = source_outgoing * normal
    conserved_sink = torch.einsum("nld,nld->nl", q + 1e-6,
                                  (k * source_outgoing[:, :, None]).cumsum(dim=1) + 1e-6) / normal
    conserved_source = torch.einsum("nld,nld->nl", k + 1e-6,
                                    (q * sink_incoming[:, :, None]).cumsum(dim=1) + 1e-6) / normal
    conserved_source = torch.clamp(conserved_source, min=-5.0, max=5.0)
    sink_allocation = torch.sigmoid(conserved_sink)
    conserved_source = torch.exp(conserved_source)
    source_competition = (conserved_source / conserved_source.cumsum(dim=-1)) * normal
    kv = torch.einsum("nld,nlm->nldm", k, v * source_competition[:, :, None]).cumsum(dim=1)
    attn = torch.einsum("nld,nldm->nlm", q * sink_incoming_keep[:, :, None], kv) * sink_allocation[:, :, None]
    attn = attn.transpose(0, 1).contiguous().view(tgt_len, bsz, embed_dim)
    return linear(attn, m.out_proj).transpose(0, 1)
