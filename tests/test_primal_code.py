"""Primal-Attention as the authors' code computes it (the published numbers come from that code), through
the options the reproduction experiments set (conf/experiment/primal_attention/{uea,lra,imagenet}.yaml).

The ``code_*`` functions are small transcriptions written from reading yingyichen-cyy/PrimalAttention
(PrimalAttention_TimeSeries: models/Primal_Attention.py, Primalformer.py, Primalformer_layers.py,
loss.py; PrimalAttention_LRA: model.py, attentions/attention.py, attention_primal_cos.py,
model_wrapper.py, lra_config.py, run_tasks.py; PrimalAttention_CV: models_primal.py,
engine_primal.py; PrimalAttention_RL: models/primal_attention.py, training/seq_trainer.py). They use
the attnbench modules' weights, so outputs and KSVD losses must agree exactly (float64); parameter
counts are derived from the tensors the authors' modules allocate.
"""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from bench_cli.engine.objective import Objective
from bench_cli.config.compose import compose
from bench_cli.config.taskfit import build_task
from attnbench.models.attention import build_attention, collect_auxiliary_loss
from attnbench.models.attention.primal import evenly_spaced_rows

pytestmark = pytest.mark.usefixtures("float64_single_thread")

PRIMAL_OPTIONS = ("ksvd_form", "ksvd_square", "rows", "init", "padding", "row_positions")


# --- transcriptions of the authors' code ----------------------------------------------------------
def code_rows(length: int, n: int) -> torch.Tensor:
    """``indices = torch.linspace(0, L-1, self.len, dtype=int)`` (UEA/LRA attention)."""
    return torch.linspace(0, length - 1, n, dtype=int)


def code_primal_layer(m, x, mask=None, zero_padded=False):
    """AttentionLayer.forward of the UEA code (attn_type primal_cos); with ``zero_padded`` the LRA
    Attention.forward + PrimalCosAttention (``attn_out = concate_weight(score) * mask``).
    Returns the output and the score list entry (escore, rscore, We, Wr) and Lambda."""
    b, length, dm = x.shape
    h = m.n_heads
    d = dm // h
    q = (x @ m.q_proj.weight.T + m.q_proj.bias).view(b, length, h, d).transpose(1, 2)
    k = (x @ m.k_proj.weight.T + m.k_proj.bias).view(b, length, h, d).transpose(1, 2)
    idx = code_rows(length, m.we.shape[1])
    xs = x.transpose(-2, -1).reshape(b, h, d, length)[:, :, :, idx].transpose(1, 2)
    we = torch.einsum("bahd,hde->bahe", xs, m.we).transpose(1, 2)
    wr = torch.einsum("bahd,hde->bahe", xs, m.wr).transpose(1, 2)
    q, k = F.normalize(q, p=2, dim=-1), F.normalize(k, p=2, dim=-1)
    e = torch.einsum("...nd,...de->...ne", q, we)
    r = torch.einsum("...nd,...de->...ne", k, wr)
    out = torch.cat((e, r), dim=-1) @ m.concat_proj.weight.T + m.concat_proj.bias
    if zero_padded:
        out = out * mask[:, None, :, None]
    out = out.transpose(1, 2).reshape(b, length, dm)
    return out @ m.out_proj.weight.T + m.out_proj.bias, (e, r, m.we, m.wr, m.lam)


def code_softmax(m, x, mask=None):
    """Canonical softmax attention: the UEA code passes no mask, the LRA code adds -1e6 at padded keys."""
    b, length, dm = x.shape
    h = m.n_heads
    d = dm // h

    def proj(lin):
        return (x @ lin.weight.T + lin.bias).view(b, length, h, d).transpose(1, 2)

    dot = proj(m.q_proj) @ proj(m.k_proj).transpose(-2, -1) / math.sqrt(d)
    if mask is not None:
        dot = dot - 1e6 * (1 - mask[:, None, None, :])
    out = (F.softmax(dot, dim=-1) @ proj(m.v_proj)).transpose(1, 2).reshape(b, length, dm)
    return out @ m.out_proj.weight.T + m.out_proj.bias


def code_ksvd_terms(scores, per_sample: bool):
    """loss_escore, loss_rscore, loss_trace of one layer (loss.py / model_wrapper.py / engine_primal.py):
    ||e diag(Lambda)||^2 averaged over heads and positions (per sample: ``dim=[1,2]``; else over all),
    halved; the trace of the raw We^T Wr averaged over heads (``--trace_no_x``)."""
    e, r, we, wr, lam = scores
    lam_diag = torch.diag_embed(lam)

    def energy(s):
        sq = torch.einsum("...nd,...ds->...ns", s, lam_diag.unsqueeze(0).repeat(s.size(0), 1, 1, 1)).norm(dim=-1, p=2) ** 2
        return (torch.mean(sq, dim=[1, 2]) if per_sample else torch.mean(sq)) / 2

    trace = torch.einsum("...ps,...pd->...sd", we, wr).mean(dim=0).trace()
    return energy(e), energy(r), trace


def code_ksvd_uea(score_list):
    """NoFussCE_KSVD (UEA loss.py): squared per sample, averaged over layers; running.py then
    averages the per-sample losses over the batch."""
    total = 0
    for scores in score_list:
        le, lr, lt = code_ksvd_terms(scores, per_sample=True)
        total = total + (le + lr - lt) ** 2
    return (total / len(score_list)).mean()


def code_ksvd_lra(score_list):
    """ModelForSC (LRA model_wrapper.py): one mean over batch, heads and positions, squared once."""
    total = 0
    for scores in score_list:
        le, lr, lt = code_ksvd_terms(scores, per_sample=False)
        total = total + (le + lr - lt) ** 2
    return total / len(score_list)


def code_ksvd_lra_dual(score_list_0, score_list_1):
    """ModelForSCDual: the two documents' terms averaged, then squared."""
    total = 0
    for s0, s1 in zip(score_list_0, score_list_1):
        e0, r0, t0 = code_ksvd_terms(s0, per_sample=False)
        e1, r1, t1 = code_ksvd_terms(s1, per_sample=False)
        total = total + (0.5 * (e0 + e1) + 0.5 * (r0 + r1) - 0.5 * (t0 + t1)) ** 2
    return total / len(score_list_0)


def layer_norm(norm, x):
    return F.layer_norm(x, norm.normalized_shape, norm.weight, norm.bias, norm.eps)


def code_uea_forward(net, x, mask):
    """PrimalformerClassiregressor.forward with its Encoder / EncoderLayer (post-norm, conv1d k=1 FFN,
    final LayerNorm, no mask to attention), eval mode."""
    h = (x @ net.input_proj.weight.T + net.input_proj.bias) * math.sqrt(net.d_model) + net.pos.pe[: x.shape[1]]
    score_list = []
    for layer in net.layers:
        if hasattr(layer.attention, "we"):
            new, scores = code_primal_layer(layer.attention, h)
            score_list.append(scores)
        else:
            new = code_softmax(layer.attention, h)
        h = layer_norm(layer.norm1, h + new)
        y = F.gelu(h @ layer.ff1.weight.T + layer.ff1.bias) @ layer.ff2.weight.T + layer.ff2.bias
        h = layer_norm(layer.norm2, h + y)
    h = layer_norm(net.final_norm, h)
    out = F.gelu(h) * mask.unsqueeze(-1)
    return out.reshape(out.shape[0], -1) @ net.head.weight.T + net.head.bias, score_list


def code_lra_encode(enc, ids, mask):
    """LRA Model.forward (pre-norm blocks, final LayerNorm times the mask) and MEAN pooling, eval mode."""
    x = enc.embed.tokens.weight[ids] + enc.embed.positions.weight[: ids.shape[1]]
    score_list = []
    for layer in enc.layers:
        if hasattr(layer.attention, "we"):
            out, scores = code_primal_layer(layer.attention, layer_norm(layer.norm1, x), mask, zero_padded=True)
            score_list.append(scores)
        else:
            out = code_softmax(layer.attention, layer_norm(layer.norm1, x), mask)
        x = out + x
        y = layer_norm(layer.norm2, x)
        x = F.gelu(y @ layer.ff1.weight.T + layer.ff1.bias) @ layer.ff2.weight.T + layer.ff2.bias + x
    x = layer_norm(enc.norm, x) * mask[:, :, None]
    return x.mean(dim=1), score_list


# Parameter tensors of the authors' models, named and shaped as their modules allocate them.
def code_linear(name, n_in, n_out):
    return [(f"{name}.weight", (n_out, n_in)), (f"{name}.bias", (n_out,))]


def code_layer_norm(name, dim):
    return [(f"{name}.weight", (dim,)), (f"{name}.bias", (dim,))]


# PrimalAttention_LRA/*/lra_config.py ("model" of each task); run_tasks.py rounds max_seq_len up to
# a power of 2 (2000 -> 2048, 4000 -> 4096) and takes low_rank / rank_multi (default 10) from the
# command line (bashes/run_tasks.sh).
CODE_LRA_CONFIG = {
    "listops": dict(vocab_size=32, max_seq_len=2000, transformer_dim=64, transformer_hidden_dim=128, head_dim=32,
                    num_head=2, num_classes=10),
    "retrieval": dict(vocab_size=512, max_seq_len=4000, transformer_dim=64, transformer_hidden_dim=128, head_dim=32,
                      num_head=2, num_classes=2),
}


def code_lra_tensors(task, attn_types, low_rank, rank_multi=10):
    """model.py (Embeddings, Transformer blocks, final norm), attentions/attention.py (W_q, W_k,
    [W_v], We, Wr, ff), attention_primal_cos.py (Lambda, concate_weight) and model_wrapper.py's
    SCHead (SCHeadDual for retrieval: the pooled pair [X_0, X_1, X_0 * X_1, X_0 - X_1])."""
    c = CODE_LRA_CONFIG[task]
    dim, hidden, heads, head_dim = c["transformer_dim"], c["transformer_hidden_dim"], c["num_head"], c["head_dim"]
    max_seq_len = int(2 ** math.ceil(math.log2(c["max_seq_len"])))
    tensors = [("embeddings.word_embeddings.weight", (c["vocab_size"], dim)),
               ("embeddings.position_embeddings.weight", (max_seq_len, dim))]
    for idx, attn_type in enumerate(attn_types):
        block = f"transformer_{idx}"
        tensors += code_layer_norm(f"{block}.norm1", dim)
        tensors += code_linear(f"{block}.mha.W_q", dim, heads * head_dim) + code_linear(f"{block}.mha.W_k", dim, heads * head_dim)
        if attn_type == "primal_cos":
            rows = low_rank * rank_multi
            tensors += [(f"{block}.mha.We", (heads, rows, low_rank)), (f"{block}.mha.Wr", (heads, rows, low_rank)),
                        (f"{block}.mha.attn.Lambda", (heads, low_rank))]
            tensors += code_linear(f"{block}.mha.attn.concate_weight", 2 * low_rank, head_dim)
        else:
            tensors += code_linear(f"{block}.mha.W_v", dim, heads * head_dim)
        tensors += code_linear(f"{block}.mha.ff", heads * head_dim, dim)
        tensors += code_layer_norm(f"{block}.norm2", dim)
        tensors += code_linear(f"{block}.mlpblock.0", dim, hidden) + code_linear(f"{block}.mlpblock.3", hidden, dim)
    tensors += code_layer_norm("norm", dim)
    head_in = 4 * dim if task == "retrieval" else dim
    tensors += code_linear("seq_classifer.mlpblock.0", head_in, hidden)
    tensors += code_linear("seq_classifer.mlpblock.2", hidden, c["num_classes"])
    return tensors


def code_uea_tensors(attn_types, *, feat_dim, max_len, classes, low_rank, rank_multi, d_model=512, d_ff=2048,
                     n_heads=8):
    """PrimalAttention_TimeSeries models/Primalformer.py (project_inp, LearnablePositionalEncoding
    ``pe`` (max_len, 1, d_model), final LayerNorm, output_layer d_model * max_len -> classes),
    Primalformer_layers.py (EncoderLayer: Conv1d k=1 pair, norm1, norm2), Primal_Attention.py
    (AttentionLayer: query/key[/value]/out projections, We, Wr of min(max_seq_len, s * rank_multi)
    rows; PrimalCosAttention: Lambda, concate_weight). d_model, d_ff, heads: options.py defaults."""
    d_keys = d_model // n_heads
    tensors = code_linear("project_inp", feat_dim, d_model) + [("pos_enc.pe", (max_len, 1, d_model))]
    for idx, attn_type in enumerate(attn_types):
        layer = f"encoder.attn_layers.{idx}"
        attn = f"{layer}.attention"
        tensors += code_linear(f"{attn}.query_projection", d_model, d_keys * n_heads)
        tensors += code_linear(f"{attn}.key_projection", d_model, d_keys * n_heads)
        if attn_type == "softmax":
            tensors += code_linear(f"{attn}.value_projection", d_model, d_keys * n_heads)
        tensors += code_linear(f"{attn}.out_projection", d_keys * n_heads, d_model)
        if attn_type == "primal_cos":
            rows = min(max_len, low_rank * rank_multi)
            tensors += [(f"{attn}.We", (n_heads, rows, low_rank)), (f"{attn}.Wr", (n_heads, rows, low_rank)),
                        (f"{attn}.inner_attention.Lambda", (n_heads, low_rank))]
            tensors += code_linear(f"{attn}.inner_attention.concate_weight", 2 * low_rank, d_keys)
        tensors += [(f"{layer}.conv1.weight", (d_ff, d_model, 1)), (f"{layer}.conv1.bias", (d_ff,)),
                    (f"{layer}.conv2.weight", (d_model, d_ff, 1)), (f"{layer}.conv2.bias", (d_model,))]
        tensors += code_layer_norm(f"{layer}.norm1", d_model) + code_layer_norm(f"{layer}.norm2", d_model)
    tensors += code_layer_norm("encoder.norm", d_model)
    tensors += code_linear("output_layer", d_model * max_len, classes)
    return tensors


def count(tensors) -> int:
    return sum(math.prod(shape) for _, shape in tensors)


# --- helpers --------------------------------------------------------------------------------------
def built(overrides, synthetic_len=None):
    cfg = compose(overrides)
    task = build_task(cfg)
    if synthetic_len:
        task.setup_synthetic(synthetic_len)
    else:
        task.setup(str(cfg.task.protocol))
    torch.manual_seed(0)
    return cfg, task, task.build_model(cfg.model).eval()


def jv_batches(task):
    """A padded batch (lengths 15-26) and an unpadded one (full-length series) of JapaneseVowels."""
    train, test = task.splits["train"].tensors, task.splits["test"].tensors
    padded = {k: v[:6] for k, v in train.items()}
    full = torch.cat([train["mask"].all(1), test["mask"].all(1)])
    both = {k: torch.cat([train[k], test[k]]) for k in train}
    unpadded = {k: v[full][:4] for k, v in both.items()}
    assert not padded["mask"].all() and unpadded["mask"].all() and len(unpadded["y"]) >= 2
    return [{**b, "x": b["x"].to(torch.float64)} for b in (padded, unpadded)]


def lra_batch(task, lengths, seq_len, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(1, int(task.cfg.vocab_size), (len(lengths), seq_len), generator=g)
    for i, n in enumerate(lengths):
        x[i, n:] = 0  # token 0 is padding
    return x


# --- item 8: row positions ------------------------------------------------------------------------
def test_code_row_positions_are_torch_integer_linspace():
    positions, used, n = evenly_spaced_rows(None, 2, 136, 100, "cpu", rule="linspace")
    want = code_rows(136, 100)
    assert used.all() and n.tolist() == [100, 100] and torch.equal(positions[0], want) and torch.equal(positions[1], want)
    floor, _, _ = evenly_spaced_rows(None, 1, 136, 100, "cpu", rule="floor")
    assert torch.equal(floor[0], torch.arange(100) * 135 // 99)
    assert (floor[0] != want).nonzero().flatten().tolist() == [11, 22, 44]  # the rules differ here
    # valid padding samples each sequence's valid positions with the same rule
    mask = torch.ones(2, 140, dtype=torch.bool)
    mask[1, 136:] = False
    mask[0, :4] = False
    positions, used, n = evenly_spaced_rows(mask, 2, 140, 100, "cpu", rule="linspace")
    assert torch.equal(positions[0], 4 + want) and torch.equal(positions[1], want)


# --- item 3: rows, initialisation and parameter counts --------------------------------------------
def test_code_rows_and_orthogonal_init_of_the_whole_tensor():
    m = build_attention("primal", d_model=512, n_heads=8, low_rank=40, rank_multi=5, rows="code", init="code",
                        max_len=26)
    assert m.we.shape == m.wr.shape == (8, 26, 40)  # min(max_seq_len, s * rank_multi)
    for w in (m.we, m.wr):
        flat = w.reshape(8, -1)  # torch's orthogonal_ flattens (heads, rows, s) to (heads, rows * s)
        torch.testing.assert_close(flat @ flat.T, torch.eye(8))
        assert 0.005 < w.abs().mean() < 0.04  # entries about 0.01-0.03 (1 / sqrt(rows * s) = 0.031)
    assert build_attention("primal", d_model=512, n_heads=8, low_rank=40, rank_multi=5).we.shape == (8, 200, 40)
    per_head = build_attention("primal", d_model=16, n_heads=2, low_rank=3, rank_multi=2)
    for h in range(2):
        torch.testing.assert_close(per_head.we[h].T @ per_head.we[h], torch.eye(3))
    independent = build_attention("primal", d_model=16, n_heads=2, low_rank=3, data_dependent=False, init="code")
    flat = independent.we.reshape(2, -1)  # (heads, d_head, s) as the RL / NLP code
    assert independent.we.shape == (2, 8, 3)
    torch.testing.assert_close(flat @ flat.T, torch.eye(2))


@pytest.mark.usefixtures("workdir")
def test_parameter_counts_equal_the_authors_models():
    uea = ["experiment=primal_attention/uea", "task.dataset=JapaneseVowels"]
    counts = {}
    for model in ("primalformer", "primal_plus"):
        _, _, net = built(uea + [f"model={model}"])
        counts["JapaneseVowels", model] = sum(p.numel() for p in net.parameters())
        for task, seq_len in (("lra_listops", 2048), ("lra_retrieval", 4096)):
            _, _, net = built(["experiment=primal_attention/lra", f"task={task}", f"model={model}"], seq_len)
            counts[task, model] = sum(p.numel() for p in net.parameters())
    # JapaneseVowels: 12 channels, series of 26, 9 classes; s and rank_multi from run_primalformer.sh
    # (40, 5) and run_primal_trans.sh (30, 5). LRA: s from the two run_tasks.sh, rank_multi 10.
    jv = dict(feat_dim=12, max_len=26, classes=9, rank_multi=5)
    want = {
        ("JapaneseVowels", "primalformer"): count(code_uea_tensors(["primal_cos"] * 2, low_rank=40, **jv)),
        ("JapaneseVowels", "primal_plus"): count(code_uea_tensors(["softmax", "primal_cos"], low_rank=30, **jv)),
        ("lra_listops", "primalformer"): count(code_lra_tensors("listops", ["primal_cos"] * 2, 20)),
        ("lra_listops", "primal_plus"): count(code_lra_tensors("listops", ["softmax", "primal_cos"], 30)),
        ("lra_retrieval", "primalformer"): count(code_lra_tensors("retrieval", ["primal_cos"] * 2, 30)),
        ("lra_retrieval", "primal_plus"): count(code_lra_tensors("retrieval", ["softmax", "primal_cos"], 20)),
    }
    assert counts == want
    # The parameter counts first reported 421,522 / 428,990 for Retrieval: the authors' retrieval models at ListOps' s
    # (PrimalFormer 20, Primal.+ 30), derived from their tensors and built here the same way.
    at_listops_s = [count(code_lra_tensors("retrieval", ["primal_cos"] * 2, 20)),
                    count(code_lra_tensors("retrieval", ["softmax", "primal_cos"], 30))]
    assert at_listops_s == [421_522, 428_990]
    _, _, pf = built(["experiment=primal_attention/lra", "task=lra_retrieval", "model=primalformer",
                      "model.attention.low_rank=20"], 4096)
    _, _, pp = built(["experiment=primal_attention/lra", "task=lra_retrieval", "model=primal_plus",
                      "model.final_attention.low_rank=30"], 4096)
    assert [sum(p.numel() for p in n.parameters()) for n in (pf, pp)] == at_listops_s


def test_code_tensor_lists_add_up_layer_by_layer():
    """The transcribed tensor lists, checked against counts worked out by hand for one block:
    LRA PrimalFormer block at s = 20, rank_multi 10, d 64, 2 heads of 32, hidden 128:
    norm1 128 + W_q, W_k 2 x 4160 + We, Wr 2 x 2 x 200 x 20 + Lambda 40 + concate_weight 40 x 32 + 32
    + ff 4160 + norm2 128 + mlp 64 x 128 + 128 + 128 x 64 + 64 = 46,664."""
    one = code_lra_tensors("listops", ["primal_cos"], 20)
    none = code_lra_tensors("listops", [], 20)
    assert count(one) - count(none) == 128 + 2 * 4160 + 2 * 2 * 200 * 20 + 40 + 40 * 32 + 32 + 4160 + 128 + 8320 + 8256
    assert count(one) - count(none) == 46_664
    # and the softmax block: W_v in place of We, Wr, Lambda, concate_weight
    soft = code_lra_tensors("listops", ["softmax"], 20)
    assert count(soft) - count(none) == 128 + 4 * 4160 + 128 + 8320 + 8256
    # embeddings + final norm + head of ListOps: 32 x 64 + 2048 x 64 + 128 + (64 x 128 + 128) + (128 x 10 + 10)
    assert count(none) == 32 * 64 + 2048 * 64 + 128 + 64 * 128 + 128 + 128 * 10 + 10


# --- items 1, 2, 4, 6, 7 and the layer reduction: whole models against the code --------------------
@pytest.mark.usefixtures("workdir")
@pytest.mark.parametrize("model,s,rank_multi", [("primalformer", 4, 10), ("primal_plus", 3, 5)])
def test_uea_reproduction_matches_the_authors_code(model, s, rank_multi):
    # the reproduction config, narrowed (d_model 16, 2 heads) so the test is fast; rows = min(26, s * rank_multi)
    role = "attention" if model == "primalformer" else "final_attention"
    cfg, task, net = built(["experiment=primal_attention/uea", "task.dataset=JapaneseVowels", f"model={model}",
                            "task.backbone.d_model=16", "task.backbone.d_ff=32", "task.backbone.n_heads=2",
                            f"model.{role}.low_rank={s}", f"model.{role}.rank_multi={rank_multi}"])
    options = {k: cfg.model[role][k] for k in PRIMAL_OPTIONS}
    assert options == {"ksvd_form": "code", "ksvd_square": "per_sample", "rows": "code", "init": "code",
                       "padding": "ignore", "row_positions": "linspace"}
    assert cfg.model.ksvd_layers == "mean" and net.final_norm is not None and not net.attention_mask
    primal = net.layers[-1].attention
    assert primal.we.shape[1] == min(26, s * rank_multi)
    assert all(layer.attention.dropout == 0.1 for layer in net.layers)  # attention dropout of every layer
    for batch in jv_batches(task):
        logits = net(**task.model_inputs(batch))
        want_logits, score_list = code_uea_forward(net, batch["x"], batch["mask"].to(torch.float64))
        torch.testing.assert_close(logits, want_logits)
        torch.testing.assert_close(collect_auxiliary_loss(net, cfg.model.ksvd_layers), code_ksvd_uea(score_list))


@pytest.mark.parametrize("model", ["primalformer", "primal_plus"])
@pytest.mark.parametrize("padded", [True, False])
def test_lra_reproduction_matches_the_authors_code(model, padded):
    # N = 136 with 100 rows: the code's integer linspace differs from floor there (k = 11, 22, 44)
    role = "attention" if model == "primalformer" else "final_attention"
    cfg, task, net = built(["experiment=primal_attention/lra", "task=lra_listops", f"model={model}",
                            f"model.{role}.low_rank=10"], synthetic_len=136)
    assert {k: cfg.model[role][k] for k in PRIMAL_OPTIONS} == {
        "ksvd_form": "code", "ksvd_square": "per_batch", "rows": "full", "init": "code", "padding": "zero_output",
        "row_positions": "linspace"}
    assert net.encoder.layers[-1].attention.we.shape[1] == 100
    x = lra_batch(task, [136, 90, 40] if padded else [136, 136], 136)
    inputs = task.model_inputs({"x": x})
    logits = net(**inputs)
    pooled, score_list = code_lra_encode(net.encoder, x, (x != 0).to(torch.float64))
    torch.testing.assert_close(logits, net.head(pooled))
    torch.testing.assert_close(collect_auxiliary_loss(net, cfg.model.ksvd_layers), code_ksvd_lra(score_list))


# --- item 5: the retrieval dual encoder's KSVD loss covers both documents -------------------------
@pytest.mark.parametrize("model", ["primalformer", "primal_plus"])
def test_retrieval_ksvd_loss_averages_both_documents_as_the_code(model):
    role = "attention" if model == "primalformer" else "final_attention"
    cfg, task, net = built(["experiment=primal_attention/lra", "task=lra_retrieval", f"model={model}",
                            f"model.{role}.low_rank=10"], synthetic_len=136)
    x1, x2 = lra_batch(task, [136, 70, 30], 136), lra_batch(task, [120, 136, 50], 136, seed=1)
    logits = net(**task.model_inputs({"x": x1, "x2": x2}))
    u, scores_1 = code_lra_encode(net.encoder, x1, (x1 != 0).to(torch.float64))
    v, scores_2 = code_lra_encode(net.encoder, x2, (x2 != 0).to(torch.float64))
    torch.testing.assert_close(logits, net.head(torch.cat([u, v, u * v, u - v], -1)))
    got = collect_auxiliary_loss(net, cfg.model.ksvd_layers)
    torch.testing.assert_close(got, code_ksvd_lra_dual(scores_1, scores_2))
    second_only = code_ksvd_lra(scores_2)
    assert abs(got - second_only) > 1e-3 * second_only  # the old behaviour: document 2 alone


def test_auxiliary_loss_never_leaks_between_steps():
    """An evaluation pass, then a training step: the step's KSVD loss is its own batch's only, for the
    dual encoder (two passes per forward) and through the trainer with the layers averaged."""
    from bench_cli.engine.trainer import Trainer

    cfg, task, net = built(["experiment=primal_attention/lra", "task=lra_retrieval", "model=primalformer",
                            "model.attention.low_rank=10", "per_dataset.eta.primalformer.aan=0.1",
                            "task.backbone.dropout=0.0", "task.backbone.attention_dropout=0.0"], synthetic_len=64)
    batch = {"x": lra_batch(task, [64, 30], 64), "x2": lra_batch(task, [50, 64], 64, seed=1), "y": torch.tensor([0, 1])}
    other = {"x": lra_batch(task, [20, 64, 33], 64, seed=2), "x2": lra_batch(task, [64, 64, 9], 64, seed=3)}
    with torch.no_grad():
        net(**task.model_inputs(batch))
        fresh = collect_auxiliary_loss(net, "mean")
        net(**task.model_inputs(other))  # an evaluation of another batch
    net.train()
    trainer = Trainer(cfg.trainer, task, net, torch.device("cpu"), 0, objective=Objective.of(task, cfg.model))
    loss = trainer.training_loss(batch)
    ce = task.loss(net(**task.model_inputs(batch)), batch)
    torch.testing.assert_close(loss, ce + 0.1 * fresh)
    primal = net.encoder.layers[0].attention
    assert primal.ksvd_objective.shape == (2, 2)  # both documents averaged into one (B, H) objective
    layers = [layer.attention for layer in net.encoder.layers]
    torch.testing.assert_close(collect_auxiliary_loss(net, "mean"),
                               (layers[0].auxiliary_loss() + layers[1].auxiliary_loss()) / 2)
    net.encoder(batch["x"], batch["x"] != 0)  # a single pass outside the dual encoder replaces both
    assert len(primal._objectives) == 1


# --- the code's forms one by one, on one layer ----------------------------------------------------
@pytest.mark.parametrize("square", ["per_sample", "per_batch"])
@pytest.mark.parametrize("padding", ["ignore", "zero_output"])
def test_layer_ksvd_forms_match_the_code(square, padding):
    torch.manual_seed(0)
    m = build_attention("primal", d_model=8, n_heads=2, low_rank=3, rank_multi=4, ksvd_form="code",
                        ksvd_square=square, rows="code", init="code", padding=padding, row_positions="linspace",
                        max_len=17).eval()
    x = torch.randn(3, 17, 8)
    mask = torch.ones(3, 17, dtype=torch.bool)
    mask[1, 11:] = False
    mask[2, 5:] = False
    got = m(x, mask)
    want, scores = code_primal_layer(m, x, mask.to(x.dtype), zero_padded=padding == "zero_output")
    torch.testing.assert_close(got, want)
    code = code_ksvd_uea if square == "per_sample" else code_ksvd_lra
    torch.testing.assert_close(m.auxiliary_loss(), code([scores]))
    paper = build_attention("primal", d_model=8, n_heads=2, low_rank=3, rank_multi=4, ksvd_square=square,
                            rows="code", init="code", padding=padding, row_positions="linspace", max_len=17)
    paper.load_state_dict(m.state_dict())
    paper.eval()(x, mask)
    assert not torch.allclose(paper.auxiliary_loss(), m.auxiliary_loss())  # e^T Lambda e differs from ||Lambda e||^2


def test_causal_data_independent_with_padding_ignored_matches_the_rl_code():
    """Primal_attention.forward of the RL code (running means over every position, count i + 1) and
    seq_trainer.py's loss (per sample, raw We/Wr trace), the path the Decision Transformer uses."""
    torch.manual_seed(0)
    m = build_attention("primal", d_model=8, n_heads=2, low_rank=3, data_dependent=False, ksvd_form="code",
                        ksvd_square="per_sample", init="code", padding="ignore").eval()
    x = torch.randn(2, 7, 8)
    mask = torch.ones(2, 7, dtype=torch.bool)
    mask[0, :3] = False  # left padding, as the D4RL batches
    got = m(x, mask, causal=True)
    b, n, h, d = 2, 7, 2, 4
    q = (x @ m.q_proj.weight.T + m.q_proj.bias).view(b, n, h, d).transpose(1, 2)
    k = (x @ m.k_proj.weight.T + m.k_proj.bias).view(b, n, h, d).transpose(1, 2)
    normal = torch.arange(n).double() + 1.0
    q = F.normalize(q.cumsum(dim=2) / normal[None, None, :, None], p=2, dim=-1)
    k = F.normalize(k.cumsum(dim=2) / normal[None, None, :, None], p=2, dim=-1)
    e = torch.einsum("...nd,...de->...ne", q, m.we.unsqueeze(0).repeat(b, 1, 1, 1))
    r = torch.einsum("...nd,...de->...ne", k, m.wr.unsqueeze(0).repeat(b, 1, 1, 1))
    out = (torch.cat((e, r), -1) @ m.concat_proj.weight.T + m.concat_proj.bias).transpose(1, 2).reshape(b, n, 8)
    torch.testing.assert_close(got, out @ m.out_proj.weight.T + m.out_proj.bias)
    torch.testing.assert_close(m.auxiliary_loss(), code_ksvd_uea([(e, r, m.we, m.wr, m.lam)]))


# --- items 6, 7: backbone options, off by default -------------------------------------------------
@pytest.mark.usefixtures("workdir")
def test_uea_backbone_defaults_are_mvts_transformer_and_experiments_set_attention_dropout():
    _, _, default = built(["model=primal_plus"])
    assert default.final_norm is None and default.attention_mask
    assert {layer.attention.dropout for layer in default.layers} == {0.0}
    _, _, table1 = built(["experiment=primal_dual/table1", "task.dataset=JapaneseVowels", "model=attention_bn_sh"])
    assert table1.final_norm is None and table1.attention_mask
    assert {layer.attention.dropout for layer in table1.layers} == {0.1}
    _, _, softmax = built(["experiment=primal_attention/uea", "task.dataset=JapaneseVowels", "model=softmax"])
    assert isinstance(softmax.final_norm, nn.LayerNorm) and not softmax.attention_mask
    assert {layer.attention.dropout for layer in softmax.layers} == {0.1}


def test_primal_refuses_a_context():
    m = build_attention("primal", d_model=8, n_heads=2, data_dependent=False)
    with pytest.raises(ValueError, match="pair query i with key i"):
        m(torch.randn(1, 4, 8), context=torch.randn(1, 5, 8))
    with pytest.raises(ValueError, match="must be one of|is not one of"):
        build_attention("primal", d_model=8, n_heads=2, padding="code")


def test_the_objective_includes_the_ksvd_term():
    """The run's one objective (trainer, a run's measurements, `attnbench profile`): the task loss
    plus eta times the KSVD loss, combined over the layers as the model says."""
    cfg, task, net = built(["experiment=primal_attention/lra", "task=lra_listops", "model=primalformer",
                            "model.attention.low_rank=4"], synthetic_len=32)
    batch = task.synthetic_batch(2, 32)
    out = net(**task.model_inputs(batch))
    loss = Objective.of(task, cfg.model).on(net, batch)(out)
    torch.testing.assert_close(loss, task.loss(out, batch) + 0.1 * collect_auxiliary_loss(net, "mean"))


# --- the CV code (PrimalAttention_CV) as conf/experiment/primal_attention/imagenet.yaml sets it ----
def code_cv_primal_layer(m, x, embed_len):
    """models_primal.py PrimalAttention.forward: one qk Linear ([W_q; W_k]), ``gen_weights`` (all
    tokens when embed_len <= s * rank_multi, else ``torch.linspace(0, N-1, s * rank_multi, dtype=int)``),
    cosine feature maps, concate_weight, proj. Returns the output and [escore, rscore, we, wr], Lambda."""
    b, n, c = x.shape
    h, d = m.n_heads, c // m.n_heads
    qk_weight, qk_bias = torch.cat([m.q_proj.weight, m.k_proj.weight]), torch.cat([m.q_proj.bias, m.k_proj.bias])
    q, k = (x @ qk_weight.T + qk_bias).reshape(b, n, 2, h, d).permute(2, 0, 3, 1, 4).unbind(0)
    rows_wanted = m.low_rank * m.rank_multi
    xs = x.transpose(-2, -1).reshape(b, h, d, n)
    if embed_len > rows_wanted:
        xs = xs[:, :, :, torch.linspace(0, n - 1, rows_wanted, dtype=int)]
    xs = xs.transpose(1, 2)
    we = torch.einsum("bahd,hde->bahe", xs, m.we).transpose(1, 2)
    wr = torch.einsum("bahd,hde->bahe", xs, m.wr).transpose(1, 2)
    escore = torch.einsum("...nd,...de->...ne", F.normalize(q, p=2, dim=-1), we)
    rscore = torch.einsum("...nd,...de->...ne", F.normalize(k, p=2, dim=-1), wr)
    out = torch.cat((escore, rscore), dim=-1) @ m.concat_proj.weight.T + m.concat_proj.bias
    out = out.transpose(1, 2).reshape(b, n, c) @ m.out_proj.weight.T + m.out_proj.bias
    return out, [escore, rscore, m.we, m.wr], m.lam


def code_cv_ksvd(score_list, lambda_list):
    """engine_primal.py train_one_epoch: per layer torch.mean over batch, heads and tokens of
    ||e diag(Lambda)||^2 / 2 (e and r), the trace of the raw We^T Wr averaged over heads, squared
    once per batch; the layers averaged (loss_ksvd / len(score_list))."""
    loss = 0
    for scores, lam in zip(score_list, lambda_list):
        lam_diag = torch.diag_embed(lam)

        def energy(s, lam_diag=lam_diag):
            return torch.mean(torch.einsum("...nd,...ds->...ns", s, lam_diag.unsqueeze(0).repeat(s.size(0), 1, 1, 1))
                              .norm(dim=-1, p=2) ** 2) / 2

        trace = torch.einsum("...ps,...pd->...sd", scores[2], scores[3]).mean(dim=0).trace()
        loss = loss + (energy(scores[0]) + energy(scores[1]) - trace) ** 2
    return loss / len(score_list)


@pytest.mark.parametrize("low_rank,rank_multi", [(None, None), (4, 10)])
def test_imagenet_reproduction_matches_the_cv_code(low_rank, rank_multi):
    """The DeiT-Small Primal.+ of the ImageNet table, narrowed (d_model 16, 2 heads, 2 blocks), 224 px
    images of 16 px patches: 197 tokens. The config's s = 96, rank_multi 10: 960 > 197, so every
    token is a row (W_e, W_r of 197 rows); s = 4: 40 rows at linspace positions."""
    sizes = ["task.backbone.d_model=16", "task.backbone.n_heads=2", "task.backbone.n_layers=2", "task.backbone.d_ff=32"]
    if low_rank:
        sizes += [f"model.final_attention.low_rank={low_rank}", f"model.final_attention.rank_multi={rank_multi}"]
    cfg, task, net = built(["experiment=primal_attention/imagenet", "task.dataset=imagenet100", "model=primal_plus",
                            *sizes], synthetic_len=197)
    options = {k: cfg.model.final_attention[k] for k in PRIMAL_OPTIONS if k != "padding"}
    assert options == {"ksvd_form": "code", "ksvd_square": "per_batch", "rows": "code", "init": "code",
                       "row_positions": "linspace"}
    assert cfg.model.ksvd_layers == "mean"
    primal = net.blocks[-1].attention
    assert type(net.blocks[0].attention).__name__ == "SoftmaxAttention"
    s, multi = low_rank or 96, rank_multi or 10
    assert (primal.low_rank, primal.rank_multi) == (s, multi) and primal.we.shape == (2, min(197, s * multi), s)
    seen = {}
    primal.register_forward_hook(lambda mod, args, out: seen.update(x=args[0], out=out))
    batch = task.synthetic_batch(3, 197)
    net(**task.model_inputs({**batch, "x": batch["x"].to(torch.float64)}))
    assert seen["x"].shape == (3, 197, 16)
    want, scores, lam = code_cv_primal_layer(primal, seen["x"], embed_len=197)
    torch.testing.assert_close(seen["out"], want)
    torch.testing.assert_close(collect_auxiliary_loss(net, cfg.model.ksvd_layers), code_cv_ksvd([scores], [lam]))


# --- sequences shorter than the rows (N < s * rank_multi) ------------------------------------------
@pytest.mark.parametrize("padding,square,max_len", [("zero_output", "per_batch", None), ("ignore", "per_sample", 40)])
def test_rows_code_on_short_sequences_repeats_rows_as_the_code(padding, square, max_len):
    """rows=code: every row of W_e, W_r is used and torch's integer linspace repeats positions (LRA
    attentions/attention.py allocates s * rank_multi rows; UEA Primal_Attention.py min(max_seq_len,
    s * rank_multi)); code_primal_layer samples ``code_rows(N, rows)`` like them."""
    torch.manual_seed(0)
    m = build_attention("primal", d_model=8, n_heads=2, low_rank=3, rank_multi=8, ksvd_form="code",
                        ksvd_square=square, rows="code", init="code", padding=padding, row_positions="linspace",
                        max_len=max_len).eval()
    assert m.we.shape[1] == 24
    for n in (7, 17, 24):
        x = torch.randn(3, n, 8)
        mask = torch.ones(3, n, dtype=torch.bool)
        mask[1, n - 3:] = False
        got = m(x, mask)
        want, scores = code_primal_layer(m, x, mask.to(x.dtype), zero_padded=padding == "zero_output")
        torch.testing.assert_close(got, want)
        code = code_ksvd_uea if square == "per_sample" else code_ksvd_lra
        torch.testing.assert_close(m.auxiliary_loss(), code([scores]))
    assert len(set(code_rows(7, 24).tolist())) == 7  # 24 rows over 7 positions: repeats


def test_short_sequences_under_rows_full_and_valid_padding():
    """rows=full: a sequence of N < rows positions samples each once and uses the first N rows of
    W_e, W_r (products and trace). rows=code with padding=valid: all rows, positions spread (with
    repeats) over each sequence's valid positions, the trace over all rows."""
    torch.manual_seed(0)
    options = dict(d_model=8, n_heads=2, low_rank=3, rank_multi=8, ksvd_form="code", ksvd_square="per_batch",
                   row_positions="linspace")
    full = build_attention("primal", padding="ignore", **options).eval()
    code = build_attention("primal", rows="code", padding="valid", **options).eval()
    code.load_state_dict(full.state_dict())
    x = torch.randn(2, 9, 8)
    mask = torch.ones(2, 9, dtype=torch.bool)
    mask[0, :2] = False
    mask[1, 6:] = False

    def by_hand(m, xb, picked, n_rows, keep):
        """Output rows ``keep`` and J per head of one sequence, X' = xb[picked] against the first n_rows."""
        q = F.normalize((xb @ m.q_proj.weight.T + m.q_proj.bias).view(-1, 2, 4).transpose(0, 1), dim=-1)
        k = F.normalize((xb @ m.k_proj.weight.T + m.k_proj.bias).view(-1, 2, 4).transpose(0, 1), dim=-1)
        rows = xb[picked].view(-1, 2, 4).transpose(0, 1)  # (heads, n_rows, d)
        we, wr = m.we[:, :n_rows], m.wr[:, :n_rows]
        e, r = q @ (rows.transpose(1, 2) @ we), k @ (rows.transpose(1, 2) @ wr)
        out = (torch.cat([e, r], -1) @ m.concat_proj.weight.T + m.concat_proj.bias).transpose(0, 1).reshape(-1, 8)
        lam2 = m.lam[:, None, :] ** 2
        energy = 0.5 * ((e * e * lam2).sum(-1)[:, keep].mean(-1) + (r * r * lam2).sum(-1)[:, keep].mean(-1))
        return (out @ m.out_proj.weight.T + m.out_proj.bias)[keep], energy - (we * wr).sum((1, 2))

    got = full(x, mask)  # padding=ignore: the 9 positions are all tokens
    for b in range(2):
        want, objective = by_hand(full, x[b], torch.arange(9), 9, torch.arange(9))
        torch.testing.assert_close(got[b], want)
        torch.testing.assert_close(full.ksvd_objective[b], objective)
    got = code(x, mask)
    for b in range(2):
        valid = mask[b].nonzero().flatten()
        picked = valid[torch.linspace(0, len(valid) - 1, 24, dtype=int)]  # 24 rows over 6-7 positions
        want, objective = by_hand(code, x[b], picked, 24, valid)
        torch.testing.assert_close(got[b, valid], want)
        torch.testing.assert_close(code.ksvd_objective[b], objective)
