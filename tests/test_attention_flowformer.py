"""Flow-Attention (models/attention/flowformer.py) against transcriptions of every family of
thuml/Flowformer, with the module's weights, float64:

* ``code_timeseries``  Flowformer_TimeSeries/models/Flow_Attention.py (AttentionLayer + Flow_Attention;
                       UEA rows of Primal-Attention Table 1): normalizer_row/col, no clamp;
* ``code_core``        Flow_Attention.py ``Flow_Attention`` (clamp [-1, 1]);
* ``code_lra``         Flowformer_LRA/.../flow_attention.py ``flow_attention`` (JAX, [b, l, h, d] layout,
                       relu + 1e-6 features), written with torch einsums;
* ``code_rl_causal``   Flowformer_RL/.../flowformer_attention.py (D4RL Table 5; clamp [-10, 10]);
                       Flow_Attention.py ``Flow_Attention_Causal`` is the same with clamp [-1, 1];
* ``code_nlp_causal``  Flowformer_NLP/flow_attention.py (fairseq (T, B*h, d) layout, ``sink_incoming_keep``;
                       WikiText-103 Table 7b; clamp [-5, 5]).
None of them uses a padding mask; ``padding="valid"`` is checked against the reference run on each
row's real tokens alone.
"""
from __future__ import annotations

import pytest
import torch

from attnbench.models.attention import attention_spec, build_attention
from attnbench.models.attention.reference.flowformer import code_timeseries, code_core, code_lra, code_rl_causal, code_nlp_causal

pytestmark = pytest.mark.usefixtures("float64_single_thread")

D_MODEL, HEADS = 8, 2


def make(**options):
    torch.manual_seed(0)
    return build_attention("flowformer", d_model=D_MODEL, n_heads=HEADS, **options).eval()


def inputs(batch=2, length=11, padded=True, seed=1):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, length, D_MODEL, generator=g)
    if not padded:
        return x, None
    mask = torch.ones(batch, length, dtype=torch.bool)
    mask[0, length - 3:] = False  # right padding
    mask[1, [0, 1, 5]] = False  # left padding and a hole
    return x, mask


# ------------------------------------------------------------------ tests


def close(a, b):
    torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_bidirectional_families_match_their_code():
    x, _ = inputs(padded=False)
    close(make()(x), code_timeseries(make(), x))  # defaults: the TimeSeries code (UEA Table 1)
    close(make(source_clamp=1.0)(x), code_core(make(), x))
    close(make(feature_map="relu", competition_over="heads")(x), code_lra(make(), x))
    # the clamp is exercised: it changes the outputs at this scale
    assert not torch.allclose(make(source_clamp=0.5)(x), make()(x))
    close(make(source_clamp=0.5)(x), code_core(make(), x, clamp=0.5))


def test_causal_families_match_their_code():
    x, _ = inputs(length=70, padded=False)  # > one chunk of the causal product
    close(make(source_clamp=10.0)(x, causal=True), code_rl_causal(make(), x))  # D4RL Table 5
    close(make(source_clamp=5.0)(x, causal=True), code_nlp_causal(make(), x))  # WikiText-103 Table 7b
    close(make(source_clamp=1.0)(x, causal=True), code_rl_causal(make(), x, clamp=1.0))  # Flow_Attention_Causal
    close(make(source_clamp=0.2)(x, causal=True), code_rl_causal(make(), x, clamp=0.2))


@pytest.mark.parametrize("causal", [False, True])
def test_padding_ignore_is_the_unmasked_code(causal):
    m = make(padding="ignore", source_clamp=10.0)
    x, mask = inputs()
    want = code_rl_causal(m, x) if causal else code_core(m, x, clamp=10.0)
    close(m(x, mask, causal=causal), want)


@pytest.mark.parametrize("causal", [False, True])
def test_padding_valid_is_the_code_on_the_real_tokens(causal):
    """valid: each row's outputs at its real tokens are the reference run on those tokens alone
    (holes closed up, left and right padding dropped)."""
    m = make(source_clamp=10.0)
    x, mask = inputs()
    got = m(x, mask, causal=causal)
    for b in range(x.shape[0]):
        real = x[b : b + 1, mask[b]]
        want = code_rl_causal(m, real) if causal else code_core(m, real, clamp=10.0)
        close(got[b, mask[b]], want[0])


@pytest.mark.parametrize("padded", [False, True])
def test_causal_outputs_ignore_later_tokens(padded):
    m = make()
    x, mask = inputs(length=70, padded=padded)
    base = m(x, mask, causal=True)
    assert torch.isfinite(base).all()
    for j in (2, 6, 64, 69):
        changed = x.clone()
        changed[:, j] += 5 * torch.randn(2, D_MODEL)
        out = m(changed, mask, causal=True)
        torch.testing.assert_close(out[:, :j], base[:, :j], rtol=0, atol=1e-12)
        assert not torch.allclose(out[:, j:], base[:, j:])


@pytest.mark.parametrize("causal", [False, True])
def test_padded_content_never_reaches_real_outputs(causal):
    m = make()
    x, mask = inputs()
    noisy = torch.where(mask[..., None], x, 50 * torch.randn_like(x))
    torch.testing.assert_close(m(noisy, mask, causal=causal)[mask], m(x, mask, causal=causal)[mask])


def test_right_padding_equals_the_unpadded_sequence():
    m = make()
    x, _ = inputs(batch=1, padded=False)
    padded = torch.cat([x, torch.randn(1, 4, D_MODEL)], 1)
    mask = torch.arange(padded.shape[1])[None] < x.shape[1]
    for causal in (False, True):
        torch.testing.assert_close(m(padded, mask, causal=causal)[:, : x.shape[1]], m(x, causal=causal))


def test_output_dropout_follows_the_output_projection():
    """Flow_Attention.py / RL: ``self.dropout(self.out_projection(x))``; TimeSeries/NLP never apply it."""
    x, mask = inputs()
    for causal in (False, True):
        plain = make(dropout=0.5, output_dropout=True)(x, mask, causal=causal)
        m = make(dropout=0.5, output_dropout=True).train()
        torch.manual_seed(7)
        dropped = m(x, mask, causal=causal)
        kept = dropped != 0
        assert 0 < kept.float().mean() < 1
        torch.testing.assert_close(dropped[kept], 2 * plain[kept])
        m_unused = make(dropout=0.5).train()  # output_dropout false: dropout is not applied anywhere
        torch.testing.assert_close(m_unused(x, mask, causal=causal), plain)


def reference_parameter_count(d_model: int) -> int:
    """Four projections with bias in every family: TimeSeries AttentionLayer (query/key/value
    nn.Linear(d_model, d_keys * n_heads), out nn.Linear(d_values * n_heads, d_model), d_keys =
    d_model // n_heads), RL/core (four nn.Linear(d_model, d_model)), LRA (DenseGeneral query, key,
    value to (heads, head_dim) and out from it, bias=True); dropout has no parameters."""
    return 4 * (d_model * d_model + d_model)


@pytest.mark.parametrize("d_model,heads,length", [(64, 2, 2000), (64, 8, 29)])  # LRA ListOps; UEA JapaneseVowels
def test_parameter_count_matches_the_reference(d_model, heads, length):
    m = build_attention("flowformer", d_model=d_model, n_heads=heads)
    assert sum(p.numel() for p in m.parameters()) == reference_parameter_count(d_model) == 16640


def test_forward_backward_finite():
    m = make(source_clamp=10.0).float().train()
    x, mask = inputs()
    x = x.float().requires_grad_(True)
    for causal in (False, True):
        x.grad = None
        m.zero_grad()
        (1e3 * m(x, mask, causal=causal)[mask].pow(2).sum()).backward()
        assert torch.isfinite(x.grad).all()
        assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in m.parameters())
    fully_padded = torch.zeros_like(mask)  # a row with no real token stays finite
    assert torch.isfinite(m(x, fully_padded)).all() and torch.isfinite(m(x, fully_padded, causal=True)).all()


def test_capabilities_and_options():
    caps = attention_spec("flowformer").capabilities
    assert caps.causal and caps.padding_mask and not caps.cross and not caps.sized_by_max_len
    with pytest.raises(TypeError, match="num_landmarks"):
        build_attention("flowformer", d_model=8, n_heads=2, num_landmarks=4)
    for bad in ({"feature_map": "elu"}, {"padding": "zero"}, {"source_clamp": 0}, {"competition_over": "keys"}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            build_attention("flowformer", d_model=8, n_heads=2, **bad)
    x, mask = inputs()
    with pytest.raises(ValueError, match="cannot attend to a context"):
        make()(x, mask, context=x, context_mask=mask)
