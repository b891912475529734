"""Primal-Attention as the authors' code computes it (issue 11), through the options the reproduction
experiments set (conf/experiment/primal_attention/{uea,lra}.yaml).

The ``code_*`` functions are small transcriptions written from reading yingyichen-cyy/PrimalAttention
(PrimalAttention_TimeSeries: models/Primal_Attention.py, Primalformer.py, Primalformer_layers.py,
loss.py; PrimalAttention_LRA: model.py, attentions/attention.py, attention_primal_cos.py,
model_wrapper.py; PrimalAttention_RL: models/primal_attention.py, training/seq_trainer.py). They use
the attnbench modules' weights, so outputs and KSVD losses must agree exactly (float64).
"""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from bench_cli.compose import compose
from bench_cli.runner import build_task
from models.attention import accumulate_auxiliary_losses, build_attention, collect_auxiliary_loss
from models.attention.primal import evenly_spaced_rows

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


def code_param_count(*, tokens_or_channels: int, max_len: int, d_model: int, d_ff: int, heads: int,
                     layers: list, classes: int, lra: bool, dual: bool = False) -> int:
    """Parameters the authors' modules allocate. ``layers``: "softmax" or (s, rows) for primal_cos.
    UEA: project_inp, LearnablePositionalEncoding, EncoderLayer (Conv1d k=1), final LayerNorm,
    output_layer (d_model * max_len -> classes). LRA: word + position embeddings, Transformer blocks,
    final LayerNorm, SCHead (or SCHeadDual on 4 * d_model)."""
    d = d_model // heads
    lin = lambda i, o: i * o + o  # noqa: E731
    total = lin(tokens_or_channels, d_model) + max_len * d_model if not lra else (tokens_or_channels + max_len) * d_model
    for layer in layers:
        if layer == "softmax":
            total += 4 * lin(d_model, d_model)
        else:
            s, rows = layer
            total += 2 * lin(d_model, d_model) + lin(d_model, d_model) + 2 * heads * rows * s + heads * s + lin(2 * s, d)
        total += lin(d_model, d_ff) + lin(d_ff, d_model) + 2 * 2 * d_model  # FFN, norm1, norm2
    total += 2 * d_model  # final LayerNorm
    if lra:
        total += lin((4 if dual else 1) * d_model, d_ff) + lin(d_ff, classes)
    else:
        total += lin(d_model * max_len, classes)
    return total


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
    jv = dict(tokens_or_channels=12, max_len=26, d_model=512, d_ff=2048, heads=8, classes=9, lra=False)
    listops = dict(tokens_or_channels=32, max_len=2048, d_model=64, d_ff=128, heads=2, classes=10, lra=True)
    retrieval = dict(tokens_or_channels=512, max_len=4096, d_model=64, d_ff=128, heads=2, classes=2, lra=True, dual=True)
    want = {  # s from run_primalformer.sh / run_primal_trans.sh / run_tasks.sh; rows min(26, 5 s) on JV, 10 s on LRA
        ("JapaneseVowels", "primalformer"): code_param_count(**jv, layers=[(40, 26)] * 2),
        ("JapaneseVowels", "primal_plus"): code_param_count(**jv, layers=["softmax", (30, 26)]),
        ("lra_listops", "primalformer"): code_param_count(**listops, layers=[(20, 200)] * 2),
        ("lra_listops", "primal_plus"): code_param_count(**listops, layers=["softmax", (30, 300)]),
        ("lra_retrieval", "primalformer"): code_param_count(**retrieval, layers=[(30, 300)] * 2),
        ("lra_retrieval", "primal_plus"): code_param_count(**retrieval, layers=["softmax", (20, 200)]),
    }
    assert counts == want
    assert [counts["JapaneseVowels", m] for m in ("primalformer", "primal_plus")] == [5_964_553, 6_199_545]
    assert [counts["lra_listops", m] for m in ("primalformer", "primal_plus")] == [236_186, 243_654]
    assert [counts["lra_retrieval", m] for m in ("primalformer", "primal_plus")] == [462_842, 408_330]
    # issue 11 printed 421,522 / 428,990 for Retrieval: those are the counts at ListOps' s (20 / 30)
    _, _, pf = built(["experiment=primal_attention/lra", "task=lra_retrieval", "model=primalformer",
                      "model.attention.low_rank=20"], 4096)
    _, _, pp = built(["experiment=primal_attention/lra", "task=lra_retrieval", "model=primal_plus",
                      "model.final_attention.low_rank=30"], 4096)
    assert [sum(p.numel() for p in n.parameters()) for n in (pf, pp)] == [421_522, 428_990]


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
    from bench_cli.trainer import Trainer

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
    trainer = Trainer(cfg.trainer, task, net, torch.device("cpu"), 0, eta=cfg.model.eta,
                      auxiliary_layers=cfg.model.ksvd_layers)
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


def test_profile_training_loss_includes_the_ksvd_term():
    """`attnbench profile` measures a training step with eta times the KSVD loss (layers as the model says)."""
    from bench_cli.profile.grid import _side_loss

    cfg, task, net = built(["experiment=primal_attention/lra", "task=lra_listops", "model=primalformer",
                            "model.attention.low_rank=4"], synthetic_len=32)
    batch = task.synthetic_batch(2, 32)
    out = net(**task.model_inputs(batch))
    loss = _side_loss(task, batch, net, float(cfg.model.eta), cfg.model.ksvd_layers)(out)
    torch.testing.assert_close(loss, task.loss(out, batch) + 0.1 * collect_auxiliary_loss(net, "mean"))
