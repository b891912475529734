"""Cross-attention (queries from x, keys/values from a padded context) against float64 reference
formulas written out here, the refusals (causal + context, variants without cross), the capability
checks per role and the registry listing."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from attnbench.models.attention import attention_spec, available_attentions, build_attention

# Which variants attend to a second sequence, and why the others do not (see each module).
CROSS = {
    "softmax", "standard", "optimised", "efficient",  # plain / column blocks of the context (papers/002)
    "attention_bn", "attention_sh", "attention_bn_sh",  # BN: mean of the context keys; SH: pooled context
    "linear", "linear_bn", "linear_sh", "linear_bn_sh",  # the linear kernel takes any key set
    "conv1d",  # queries convolved along x, keys along the context
    "performer", "yoso_e",  # feature maps / expectation weights of any key set
}
# Compared with transcriptions of their reference code in their own test files
# (tests/test_attention_performer.py, tests/test_attention_yoso.py).
OWN_REFERENCE = {"performer", "yoso_e"}  # not: sparse* (patterns need aligned positions), conv2d (one grid), super (fixed l), primal
D_MODEL, HEADS, BATCH = 8, 2, 2

pytestmark = pytest.mark.usefixtures("float64_single_thread")


def make(name, **extra):
    sized = {"max_len": 7}
    opts = {"super": sized, "linformer": sized, "soft": sized, "sparse": {"block_size": 2}}.get(name.split("_")[0], {})
    torch.manual_seed(0)
    return build_attention(name, d_model=D_MODEL, n_heads=HEADS, **{**opts, **extra}).eval()


def padded_inputs(n_queries, n_context, seed=1):
    """x (B, N, d), context (B, M, d), query mask and context mask with padding in both rows:
    row 0 right-padded, row 1 with holes (keys 0 and 2)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(BATCH, n_queries, D_MODEL, generator=g)
    context = torch.randn(BATCH, n_context, D_MODEL, generator=g)
    mask = torch.ones(BATCH, n_queries, dtype=torch.bool)
    mask[1, n_queries - 1:] = False
    context_mask = torch.ones(BATCH, n_context, dtype=torch.bool)
    context_mask[0, n_context - 2:] = False
    context_mask[1, [0, 2]] = False
    return x, context, mask, context_mask


# --------------------------------------------------------------------------- reference formulas


def linear_map(t, layer):
    """t W^T + b, written out."""
    out = torch.einsum("bnc,oc->bno", t, layer.weight)
    return out if layer.bias is None else out + layer.bias


def per_head(t, h):
    b, n, c = t.shape
    return t.reshape(b, n, h, c // h).permute(0, 2, 1, 3)  # (B, H, N, c/h)


def joined(t):
    b, h, n, c = t.shape
    return t.permute(0, 2, 1, 3).reshape(b, n, h * c)


def softmax_rows(q, k, v, valid):
    """softmax(q k^T / sqrt(D)) v over the valid keys (B, M) or query-key pairs (B, N, M), one head."""
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    scores = scores.masked_fill(~(valid[:, None, :] if valid.dim() == 2 else valid), float("-inf"))
    return torch.softmax(scores, -1) @ v


def linear_rows(q, k, v, valid):
    """Eqn. 27 with Phi = elu + 1 over the valid keys."""
    phi_q, phi_k = F.elu(q) + 1, (F.elu(k) + 1) * valid[:, :, None]
    weights = phi_q @ phi_k.transpose(-1, -2)  # (B, N, M)
    return weights @ v / weights.sum(-1, keepdim=True)


def pool(t, valid, f):
    """Masked mean over windows of f context positions; a window is valid if any position is."""
    b, m, c = t.shape
    n_pooled = -(-m // f)
    out = torch.zeros(b, n_pooled, c)
    out_valid = torch.zeros(b, n_pooled, dtype=torch.bool)
    for j in range(n_pooled):
        w = valid[:, j * f:(j + 1) * f].to(t.dtype)
        out[:, j] = (t[:, j * f:(j + 1) * f] * w[..., None]).sum(1) / w.sum(1).clamp(min=1)[:, None]
        out_valid[:, j] = w.sum(1) > 0
    return out, out_valid


def conv_same(t, weight, causal=False):
    """Zero-padded 'same' 1D convolution of every channel of (B, N, C) with the kernel w (s,);
    ``causal``: all s - 1 zeros before, so output i mixes inputs <= i."""
    s, n = weight.numel(), t.shape[1]
    before = s - 1 if causal else (s - 1) // 2
    out = torch.zeros_like(t)
    for i in range(n):
        for tap in range(s):
            j = i + tap - before
            if 0 <= j < n:
                out[:, i] += weight[tap] * t[:, j]
    return out


def reference(name, m, x, context, mask, context_mask):
    """The variant's cross-attention output, from its definition and the module's parameters."""
    h, dh = m.n_heads, m.d_head
    rows = linear_rows if name.startswith("linear") else softmax_rows
    q = linear_map(x, m.q_proj)
    if name in ("optimised", "efficient"):  # papers/002 Def. 2-3: column blocks of the context
        k = context if name == "efficient" else linear_map(context, m.k_proj)
        out = [softmax_rows(q[..., i * dh:(i + 1) * dh], k[..., i * dh:(i + 1) * dh],
                            context[..., i * dh:(i + 1) * dh], context_mask) for i in range(h)]
        return linear_map(torch.cat(out, -1), m.out_proj)
    if name == "conv1d":  # Eqn. 45: Q convolved along x (causally: a decoder's), K along the context
        w = m.conv.weight.reshape(-1)
        q = conv_same(q * mask[..., None], w, causal=True)
        k = conv_same(linear_map(context, m.k_proj) * context_mask[..., None], w)
        v = linear_map(context, m.v_proj)
        return linear_map(joined(softmax_rows(per_head(q, h).flatten(0, 1), per_head(k, h).flatten(0, 1),
                                              per_head(v, h).flatten(0, 1), context_mask.repeat_interleave(h, 0))
                                 .unflatten(0, (x.shape[0], h))), m.out_proj)
    factors = getattr(m, "sh_factors", [1] * h)
    bn = name.endswith("_bn") or name.endswith("_bn_sh")
    out = []
    for i in range(h):
        cols = slice(i * dh, (i + 1) * dh)
        pooled, valid = pool(context, context_mask, factors[i]) if factors[i] > 1 else (context, context_mask)
        k = linear_map(pooled, m.k_proj)[..., cols]
        v = linear_map(pooled, m.v_proj)[..., cols]
        qi = q[..., cols]
        if bn:  # Eqn. 26: shift by beta times the mean of the head's valid context keys
            w = valid[..., None].to(k.dtype)
            n_valid = w.sum(1, keepdim=True).clamp(min=1)
            mu = (k * w).sum(1, keepdim=True) / n_valid
            std = torch.sqrt(((k - mu) ** 2 * w).sum(1, keepdim=True) / n_valid + 1e-5)
            qi, k = qi - m.beta * mu, k - m.beta * mu
            if m.bn_scale:  # Eqn. 22-23: divide by the keys' standard deviation
                qi, k = qi / std, k / std
        out.append(rows(qi, k, v, valid))
    return linear_map(torch.cat(out, -1), m.out_proj)


# --------------------------------------------------------------------------- tests


def cross_options(name):
    """Options that exercise more of a variant: SH factors that are not sorted, BN with scale."""
    opts = {}
    if "_sh" in name:
        opts["sh_factors"] = [3, 1]
    if name.endswith("_bn") or name.endswith("_bn_sh"):
        opts.update(beta=0.7, bn_scale=name.startswith("attention_bn_sh"))
    if name == "conv1d":
        opts["kernel_size"] = 3
    if name == "performer":  # padded keys out of the denominator too (the LRA code keeps them in it)
        opts["padded_keys"] = "excluded"
    return opts


def test_registry_declares_cross_for_exactly_the_capable_variants():
    declared = {n for n in available_attentions() if attention_spec(n).capabilities.cross}
    assert declared == CROSS


@pytest.mark.parametrize("name", sorted(CROSS - OWN_REFERENCE))
@pytest.mark.parametrize("n_queries,n_context", [(5, 7), (6, 3), (4, 4)])
def test_cross_attention_matches_the_reference(name, n_queries, n_context):
    m = make(name, **cross_options(name))
    x, context, mask, context_mask = padded_inputs(n_queries, n_context)
    out = m(x, mask, context=context, context_mask=context_mask)
    assert out.shape == x.shape and torch.isfinite(out).all()
    expected = reference(name, m, x, context, mask, context_mask)
    torch.testing.assert_close(out[mask], expected[mask])
    if name != "conv1d":  # queries do not interact: padded queries get the same formula
        torch.testing.assert_close(out, expected)


@pytest.mark.parametrize("name", sorted(CROSS))
def test_padded_context_keys_never_influence_the_output(name):
    m = make(name, **cross_options(name))
    x, context, mask, context_mask = padded_inputs(5, 7)
    base = m(x, mask, context=context, context_mask=context_mask)
    noisy = torch.where(context_mask[..., None], context, 100 * torch.randn_like(context))
    torch.testing.assert_close(m(x, mask, context=noisy, context_mask=context_mask), base)
    # and dropping the right padding of the context is the same as masking it
    trimmed = m(x[:1], mask[:1], context=context[:1, :5], context_mask=None)
    torch.testing.assert_close(trimmed, base[:1])


@pytest.mark.parametrize("name", sorted(CROSS))
def test_fully_padded_context_and_padded_queries_stay_finite(name):
    m = make(name, **cross_options(name)).float().train()  # float32: where overflow shows
    x, context, mask, context_mask = (t.float() if t.is_floating_point() else t for t in padded_inputs(5, 7))
    context_mask[1] = False
    x.requires_grad_(True)
    out = m(x, mask, context=context, context_mask=context_mask)
    assert torch.isfinite(out).all()
    out[mask].sum().backward()
    assert torch.isfinite(x.grad).all()
    for pname, p in m.named_parameters():
        assert p.grad is None or torch.isfinite(p.grad).all(), pname


@pytest.mark.parametrize("name", ["linear", "linear_sh"])
def test_causal_query_that_sees_no_key_has_finite_gradients(name):
    """Left padding: the first real query of a causal linear kernel has no key before it
    (float32, where dividing by the smallest normal number overflowed the backward pass)."""
    m = make(name).float().train()
    x, _, mask, _ = padded_inputs(6, 6)
    mask[0, :2] = False
    # a loss scale (as mixed precision uses) made the old 1/tiny factor overflow into inf * 0 = NaN
    (1e3 * m(x.float(), mask, causal=True)[mask].sum()).backward()
    assert all(torch.isfinite(p.grad).all() for p in m.parameters())


@pytest.mark.parametrize("name", sorted(CROSS - {"conv1d"}))  # conv1d: a cross-attention's queries are causal
def test_self_attention_is_cross_attention_to_itself(name):
    m = make(name, **cross_options(name))
    x, _, mask, _ = padded_inputs(6, 6)
    torch.testing.assert_close(m(x, mask, context=x, context_mask=mask), m(x, mask))


@pytest.mark.parametrize("name", sorted(CROSS))
def test_causal_with_a_context_is_refused(name):
    m = make(name)
    x, context, mask, context_mask = padded_inputs(4, 5)
    with pytest.raises(ValueError, match="causal=True with a context"):
        m(x, mask, causal=True, context=context, context_mask=context_mask)


@pytest.mark.parametrize("name", sorted(set(available_attentions()) - CROSS - {"primal"}))
def test_variants_without_cross_refuse_a_context(name):
    m = make(name)
    x, context, mask, context_mask = padded_inputs(4, 4)
    with pytest.raises(ValueError, match="cannot attend to a context"):
        m(x, mask, context=context, context_mask=context_mask)


def test_bad_context_shapes_are_refused():
    m = make("softmax")
    x, context, mask, context_mask = padded_inputs(4, 5)
    with pytest.raises(ValueError, match="context must be"):
        m(x, context=context[..., :4])
    with pytest.raises(ValueError, match="context_mask must be"):
        m(x, context=context, context_mask=context_mask[:, :3])
    with pytest.raises(ValueError, match="without a context"):
        m(x, mask, context_mask=context_mask)


# --------------------------------------------------------------------------- roles


def model_cfg(**attentions):
    from omegaconf import OmegaConf

    return OmegaConf.create({key: ({"name": v} if isinstance(v, str) else v) for key, v in attentions.items()})


TRANSLATION = {"encoder": 1, "decoder": 2, "cross": 2}  # papers/002 B.4.2: 1 encoder, 2 decoder blocks


def test_capability_problems_name_the_variant_role_and_layers():
    from attnbench.models.roles import capability_problems

    assert capability_problems(model_cfg(attention="efficient"), TRANSLATION) == []
    assert capability_problems(model_cfg(attention="softmax", cross_attention="primal"), TRANSLATION) == [
        "primal cannot be the cross-attention (layers 1-2 of 2): it lacks cross"]
    assert capability_problems(model_cfg(attention="super"), TRANSLATION) == [
        "super cannot be the cross-attention (layers 1-2 of 2): it lacks cross"]
    assert capability_problems(model_cfg(attention="conv2d"), {"decoder": 3}) == [
        "conv2d cannot be the causal self-attention (layers 1-3 of 3): it lacks causal"]
    # a non-causal variant is fine as encoder and cross-attention, not as the decoder's self-attention
    assert capability_problems(model_cfg(attention="linear_bn"), TRANSLATION) == [
        "linear_bn cannot be the causal self-attention (layers 1-2 of 2): it lacks causal"]
    # Primal.+-style last layer: only the self-attention stacks take it
    assert capability_problems(model_cfg(attention="softmax", final_attention="conv2d"), TRANSLATION) == [
        "conv2d cannot be the causal self-attention (layer 2 of 2): it lacks causal"]


def test_build_role_attentions_builds_every_role_or_refuses():
    from attnbench.models.attention.better import BetterAttention
    from attnbench.models.attention.softmax import SoftmaxAttention
    from attnbench.models.roles import build_role_attentions

    stacks = build_role_attentions(model_cfg(attention="super", cross_attention="softmax"), TRANSLATION,
                                   D_MODEL, HEADS, {"encoder": 7, "decoder": 5})
    assert {role: len(mods) for role, mods in stacks.items()} == TRANSLATION
    assert [m.max_len for m in stacks["encoder"]] == [7] and [m.max_len for m in stacks["decoder"]] == [5, 5]
    assert all(isinstance(m, BetterAttention) for m in stacks["encoder"] + stacks["decoder"])
    assert all(type(m) is SoftmaxAttention for m in stacks["cross"])
    assert stacks["decoder"][0] is not stacks["decoder"][1]
    with pytest.raises(ValueError, match=r"primal cannot be the cross-attention \(layer 1 of 1\)"):
        build_role_attentions(model_cfg(attention="primal"), {"decoder": 1, "cross": 1}, D_MODEL, HEADS, 5)


# --------------------------------------------------------------------------- decoder block


CAUSAL = sorted(n for n in available_attentions() if attention_spec(n).capabilities.causal)
SELF_OPTIONS = {"primal": {"data_dependent": False}, "super": {"max_len": 9}, "sparse": {"block_size": 2}}


def decoder(name, norm_first, cross="softmax", **kwargs):
    from attnbench.models.layers import DecoderLayer

    torch.manual_seed(0)
    options = SELF_OPTIONS.get(name.split("_")[0], {})
    self_attention = build_attention(name, d_model=D_MODEL, n_heads=HEADS, **options)
    cross_attention = build_attention(cross, d_model=D_MODEL, n_heads=HEADS) if cross else None
    return DecoderLayer(self_attention, D_MODEL, 16, 0.0, "relu", norm_first, cross_attention, **kwargs).eval()


@pytest.mark.parametrize("name", CAUSAL)
@pytest.mark.parametrize("norm_first", [False, True])
def test_decoder_layer_is_causal(name, norm_first):
    layer = decoder(name, norm_first)
    x, context, mask, context_mask = padded_inputs(9, 6)
    mask[0, :2] = False  # left padding too: early queries see no key
    base = layer(x, mask, context, context_mask)
    assert torch.isfinite(base).all()
    for t in (1, 4, 8):
        changed = x.clone()
        changed[:, t:] = 10 * torch.randn(BATCH, 9 - t, D_MODEL)
        out = layer(changed, mask, context, context_mask)
        torch.testing.assert_close(out[:, :t], base[:, :t], msg=f"{name}: token {t} leaked backwards")
        assert not torch.allclose(out[:, t:], base[:, t:])


@pytest.mark.parametrize("norm_first", [False, True])
def test_decoder_layer_follows_its_formula(norm_first):
    """keras-io's TransformerDecoder (post-norm) / fairseq's normalize_before layer (pre-norm)."""
    layer = decoder("softmax", norm_first)
    x, context, mask, context_mask = padded_inputs(5, 7)

    def self_attn(h):
        return reference("softmax", layer.attention, h, h, mask, causal_ok(mask, h.shape[1]))

    def cross_attn(h):
        return reference("softmax", layer.cross_attention, h, context, mask, context_mask)

    def ffn(h):
        return linear_map(torch.relu(linear_map(h, layer.ff1)), layer.ff2)

    def ln(norm, h):
        return F.layer_norm(h, (D_MODEL,), norm.weight, norm.bias, norm.eps)

    h = x
    for norm, f in ((layer.norm1, self_attn), (layer.norm_cross, cross_attn), (layer.norm2, ffn)):
        h = h + f(ln(norm, h)) if norm_first else ln(norm, h + f(h))
    out = layer(x, mask, context, context_mask)
    torch.testing.assert_close(out[mask], h[mask])


def causal_ok(mask, n):
    """(B, N, N) keys a query may use: real and not later (for the reference's softmax_rows)."""
    return mask[:, None, :] & torch.ones(n, n, dtype=torch.bool).tril()


def test_decoder_layer_without_cross_attention_and_context_checks():
    layer = decoder("softmax", True, cross=None)
    x, context, mask, context_mask = padded_inputs(5, 7)
    assert layer(x, mask).shape == x.shape and not hasattr(layer, "norm_cross")
    with pytest.raises(ValueError, match="context is needed exactly when"):
        layer(x, mask, context, context_mask)
    with pytest.raises(ValueError, match="context is needed exactly when"):
        decoder("softmax", True)(x, mask)
    # padded context tokens do not reach the decoder's output
    layer = decoder("efficient", False, cross="efficient")
    noisy = torch.where(context_mask[..., None], context, 100 * torch.randn_like(context))
    torch.testing.assert_close(layer(x, mask, noisy, context_mask), layer(x, mask, context, context_mask))


def test_decoder_layer_dropout_rates():
    layer = decoder("softmax", False, activation_dropout=0.3)
    assert layer.dropout_ff.p == 0.3 and layer.dropout1.p == layer.dropout_cross.p == layer.dropout2.p == 0.0


# --------------------------------------------------------------------------- listing


def test_ls_models_shows_cross_for_the_capable_variants(capsys, workdir):
    from bench_cli.commands.cli import main
    from bench_cli.config import compose

    main(["ls", "models"])
    supports, current = {}, None
    for line in capsys.readouterr().out.splitlines()[1:]:  # at 80 columns: a block per model
        if not line.startswith(" "):
            current = line.strip()
        elif line.startswith("  cannot do: "):
            supports[current] = line.split(": ", 1)[1].strip()
    assert set(supports) == set(compose.group_options("model"))
    for name, text in supports.items():
        m = compose.load_option("model", name)
        shown = m.final_attention.name if m.get("final_attention") else m.attention.name
        assert ("cross" in text.split(", ")) != attention_spec(shown).capabilities.cross, name  # "cannot do" column
