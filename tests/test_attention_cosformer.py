"""cosFormer (models/attention/cosformer.py) against a transcription of the authors' code.

``code_cosformer`` is written from OpenNLPLab/cosFormer ``cosformer.py`` (``CosformerAttention.forward``,
(L, B, E) layout, heads folded into the batch as ``view(-1, bsz * num_heads, head_dim)``), with the
module's weights; ``code_left_product`` from its ``left_product`` (the explicit L x S weights, the
authors' own check of the decomposition). Padding (``padding="valid"``) is transcribed the mlpen
LRA way, the re-weighted keys multiplied by the mask. float64 throughout.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from attnbench.models.attention import attention_spec, build_attention
from attnbench.models.attention.kernels import causal_linear_product
from attnbench.models.attention.reference.cosformer import code_cosformer, code_left_product

pytestmark = pytest.mark.usefixtures("float64_single_thread")

D_MODEL, HEADS = 8, 2


def make(**options):
    torch.manual_seed(0)
    return build_attention("cosformer", d_model=D_MODEL, n_heads=HEADS, **options).eval()


def inputs(batch=2, length=11, padded=True, seed=1):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, length, D_MODEL, generator=g)
    if not padded:
        return x, None
    mask = torch.ones(batch, length, dtype=torch.bool)
    mask[0, length - 3:] = False  # right padding
    mask[1, [1, 4]] = False  # holes
    return x, mask


# ------------------------------------------------------------------ tests


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("padded", [False, True])
def test_matches_the_authors_code(causal, padded):
    m = make()
    x, mask = inputs(padded=padded)
    got = m(x, mask, causal=causal)
    want = code_cosformer(m, x, causal, mask)
    rows = slice(None) if mask is None else mask
    torch.testing.assert_close(got[rows], want[rows], rtol=1e-10, atol=1e-12)
    # and the decomposition is the explicit cos re-weighting (the authors' left_product)
    torch.testing.assert_close(got[rows], code_left_product(m, x, causal, mask)[rows], rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("causal", [False, True])
def test_gradients_match_the_authors_code(causal):
    m = make()
    x, mask = inputs()
    x.requires_grad_(True)
    weights = torch.linspace(-1, 1, D_MODEL)

    def grads(forward):
        return torch.autograd.grad((forward()[mask] * weights).sin().sum(), [x, *m.parameters()])

    for ours, theirs in zip(grads(lambda: m(x, mask, causal=causal)), grads(lambda: code_cosformer(m, x, causal, mask))):
        torch.testing.assert_close(ours, theirs)


@pytest.mark.parametrize("causal", [False, True])
def test_padding_ignore_is_the_unmasked_reference(causal):
    m = make(padding="ignore")
    x, mask = inputs()
    torch.testing.assert_close(m(x, mask, causal=causal), code_cosformer(m, x, causal), rtol=1e-10, atol=1e-12)


def test_elu_feature_map_is_elu_plus_one():
    m = make(feature_map="elu")
    x, _ = inputs(padded=False)
    for causal in (False, True):
        want = code_cosformer(m, x, causal, act=lambda t: F.elu(t) + 1)
        torch.testing.assert_close(m(x, causal=causal), want, rtol=1e-10, atol=1e-12)


def test_m_is_the_padded_length():
    """M is the tensor's length (the reference's max(src_len, tgt_len)): appending padding changes
    real outputs through M, never through the padded tokens' content."""
    m = make()
    x, _ = inputs(batch=1, padded=False)
    longer = torch.cat([x, torch.randn(1, 3, D_MODEL)], 1)
    mask = torch.arange(longer.shape[1])[None] < x.shape[1]
    padded_out = m(longer, mask)[:, : x.shape[1]]
    assert not torch.allclose(padded_out, m(x))
    torch.testing.assert_close(padded_out, code_cosformer(m, longer, False, mask)[:, : x.shape[1]])


@pytest.mark.parametrize("padded", [False, True])
def test_causal_outputs_ignore_later_tokens(padded):
    m = make()
    x, mask = inputs(length=70, padded=padded)  # > one chunk of causal_linear_product
    if mask is not None:
        mask[0, :3] = False  # left padding: the first real query sees only itself
    base = m(x, mask, causal=True)
    assert torch.isfinite(base).all()
    for j in (1, 5, 64, 69):
        changed = x.clone()
        changed[:, j] += 5 * torch.randn(2, D_MODEL)
        out = m(changed, mask, causal=True)
        torch.testing.assert_close(out[:, :j], base[:, :j], rtol=0, atol=1e-12)
        if mask is None or mask[:, j].all():  # a real token j does reach position j and later
            assert not torch.allclose(out[:, j:], base[:, j:])


@pytest.mark.parametrize("causal", [False, True])
def test_padded_content_never_reaches_real_outputs(causal):
    m = make()
    x, mask = inputs()
    noisy = torch.where(mask[..., None], x, 50 * torch.randn_like(x))
    torch.testing.assert_close(m(noisy, mask, causal=causal)[mask], m(x, mask, causal=causal)[mask])


def test_causal_linear_product_is_the_prefix_sum():
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 3, 130, d, generator=g) for d in (4, 4, 5))
    want = torch.einsum("bhld,bhldm->bhlm", q, torch.einsum("bhld,bhlm->bhldm", k, v).cumsum(2))
    torch.testing.assert_close(causal_linear_product(q, k, v), want)


def reference_parameter_count(embed_dim: int) -> int:
    """CosformerAttention.__init__: k_proj, v_proj, q_proj, out_proj = nn.Linear(embed_dim, embed_dim)
    (with bias); ``get_index`` builds an nn.Parameter per forward but never registers it."""
    return 4 * (embed_dim * embed_dim + embed_dim)


@pytest.mark.parametrize("d_model,heads,length", [(64, 2, 2000), (64, 8, 29)])  # LRA ListOps; UEA JapaneseVowels
def test_parameter_count_matches_the_reference(d_model, heads, length):
    """LRA: mlpen lra_config transformer_dim 64 = num_head 2 x head_dim 32 (max_seq_len 2000 sizes
    nothing); UEA: d_model 64, 8 heads, length 29."""
    m = build_attention("cosformer", d_model=d_model, n_heads=heads)
    assert sum(p.numel() for p in m.parameters()) == reference_parameter_count(d_model) == 16640


def test_forward_backward_finite():
    m = make().float().train()
    x, mask = inputs()
    x, mask = x.float().requires_grad_(True), mask
    mask[0, :2] = False
    for causal in (False, True):
        x.grad = None
        m.zero_grad()
        m(x, mask, causal=causal)[mask].pow(2).sum().backward()
        assert torch.isfinite(x.grad).all()
        assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in m.parameters())


def test_capabilities_and_options():
    caps = attention_spec("cosformer").capabilities
    assert caps.causal and caps.padding_mask and not caps.cross and not caps.sized_by_max_len
    with pytest.raises(TypeError, match="num_landmarks"):
        build_attention("cosformer", d_model=8, n_heads=2, num_landmarks=4)
    with pytest.raises(ValueError, match="feature_map"):
        build_attention("cosformer", d_model=8, n_heads=2, feature_map="softplus")
    with pytest.raises(ValueError, match="padding"):
        build_attention("cosformer", d_model=8, n_heads=2, padding="zero")
    x, mask = inputs()
    with pytest.raises(ValueError, match="cannot attend to a context"):
        make()(x, mask, context=x, context_mask=mask)
