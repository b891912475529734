"""Longformer attention (models/attention/longformer.py) against a float64 transcription of what
mlpen/YOSO ``encoders/backbones/efficient_attentions/attention_longformer.py`` computes: transformers'
``LongformerSelfAttention`` (3.x modeling_longformer.py) with all six projections tied to the LRA
Attention's W_q, W_k, W_v, an attention mask ``mask - 1`` with ``mask[:, 0] = 1``
(first_token_view), then the LRA Attention's ``ff``. The transcription follows the reference's
rules query by query: window scores for offsets -w..w (-inf outside the sequence, -10000 added to
keys whose mask is not 0, i.e. padding and global tokens), global-key columns in front (-10000 for
missing ones), softmax, padded queries zeroed; global queries overwritten by attention over all
keys with query_global/key_global/value_global (-10000 at padded keys)."""
from __future__ import annotations

import math

import pytest
import torch

from attnbench.models.attention import attention_spec, build_attention
from attnbench.models.attention.reference.common import linear
from attnbench.models.attention.reference.longformer import code_longformer

pytestmark = pytest.mark.usefixtures("float64_single_thread")
D_MODEL, HEADS = 8, 2


def make(**options):
    torch.manual_seed(0)
    return build_attention("longformer", d_model=D_MODEL, n_heads=HEADS, **options).eval()


def batch(n, padded, seed=1):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2, n, D_MODEL, generator=g)
    mask = torch.ones(2, n, dtype=torch.bool)
    if padded:
        mask[0, n - 3:] = False  # right padding
        mask[1, [2, 5]] = False  # holes (token 0 stays real: the reference makes it global regardless)
    return x, mask


def dense_pattern(m, x, allowed):
    """softmax(q k^T / sqrt(d)) v over an explicit (B, N, N) key pattern; rows without keys -> 0."""
    b, n, _ = x.shape
    h, d = m.n_heads, m.d_head
    q = linear(x, m.q_proj).view(b, n, h, d).transpose(1, 2)
    k = linear(x, m.k_proj).view(b, n, h, d).transpose(1, 2)
    v = linear(x, m.v_proj).view(b, n, h, d).transpose(1, 2)
    scores = (q @ k.transpose(-1, -2) / math.sqrt(d)).masked_fill(~allowed[:, None], float("-inf"))
    probs = torch.nan_to_num(torch.softmax(scores, -1))
    return linear((probs @ v).transpose(1, 2).reshape(b, n, h * d), m.out_proj)


def longformer_pattern(mask, w, n_global, causal):
    """Keys each query may use: window |i-j| <= w, global tokens (first n_global real) both ways."""
    n = mask.shape[1]
    i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
    is_global = (torch.arange(n) < n_global)[None, :] & mask
    allowed = ((i - j).abs() <= w)[None] | is_global[:, None, :] | is_global[:, :, None]
    allowed = allowed & mask[:, None, :] & mask[:, :, None]
    return allowed & (j <= i) if causal else allowed


# --------------------------------------------------------------------------- tests


@pytest.mark.parametrize("n,window,global_tokens", [(13, 4, 1), (16, 8, 1), (11, 2, 0), (9, 16, 1), (20, 6, 1)])
@pytest.mark.parametrize("padded", [False, True])
def test_matches_the_reference_transcription(n, window, global_tokens, padded):
    m = make(window_size=window, global_tokens=global_tokens)
    x, mask = batch(n, padded)
    out = m(x, mask if padded else None)
    expected = code_longformer(m, x, mask, first_token_view=global_tokens == 1)
    torch.testing.assert_close(out[mask], expected[mask])
    torch.testing.assert_close(out, m(x, mask))  # no mask = all real


@pytest.mark.parametrize("global_tokens", [0, 1, 3])
@pytest.mark.parametrize("causal", [False, True])
def test_matches_the_pattern_written_densely(global_tokens, causal):
    """Several global tokens (an extension of first_token_view) and the causal form (window and
    global tokens restricted to keys j <= i) against the same rule written as an N x N mask."""
    m = make(window_size=4, global_tokens=global_tokens)
    x, mask = batch(14, True)
    out = m(x, mask, causal=causal)
    expected = dense_pattern(m, x, longformer_pattern(mask, 2, global_tokens, causal))
    torch.testing.assert_close(out[mask], expected[mask])


def test_causal_later_tokens_never_change_earlier_outputs():
    m = make(window_size=6, global_tokens=2)
    x, mask = batch(15, True)
    mask[1, :2] = False  # left padding: the global positions are padding in this row
    base = m(x, mask, causal=True)
    for t in (1, 4, 9, 14):
        y = x.clone()
        y[:, t:] = 10 * torch.randn(2, 15 - t, D_MODEL)
        out = m(y, mask, causal=True)
        torch.testing.assert_close(out[:, :t], base[:, :t])


@pytest.mark.parametrize("causal", [False, True])
def test_padded_positions_do_not_reach_real_outputs(causal):
    m = make(window_size=4, global_tokens=1)
    x, mask = batch(17, True)
    mask[1, 0] = False  # a padded first token is not made global here
    base = m(x, mask, causal=causal)
    noisy = torch.where(mask[..., None], x, 50 * torch.randn_like(x))
    torch.testing.assert_close(m(noisy, mask, causal=causal)[mask], base[mask])


def test_no_n_by_n_scores():
    """The windowed scores are N x 3w (block-wise), not N x N: check the memory the forward needs
    grows linearly with the length by counting score elements through a patched einsum."""
    seen = []
    real_einsum = torch.einsum

    def spy(eq, *ops):
        result = real_einsum(eq, *ops)
        seen.append(result.numel())
        return result

    m = make(window_size=4, global_tokens=1)
    x, mask = batch(64, False)
    torch.einsum = spy
    try:
        m(x, mask)
    finally:
        torch.einsum = real_einsum
    assert max(seen) <= 2 * HEADS * 64 * 3 * 2  # B * H * N * 3w


def test_parameter_counts_equal_the_reference():
    """mlpen LRA Attention: W_q, W_k, W_v, ff = nn.Linear with bias; LongformerSelfAttention's six
    projections (query, key, value and their *_global twins) all become W_q / W_k / W_v, so it adds
    no parameter of its own."""

    def reference_count(dim, heads, head_dim):
        inner = heads * head_dim
        return 3 * (dim * inner + inner) + (inner * dim + dim)

    lra = build_attention("longformer", d_model=64, n_heads=2)  # lra_config: 64 / 2 heads of 32
    assert sum(p.numel() for p in lra.parameters()) == reference_count(64, 2, 32) == 16_640
    uea = build_attention("longformer", d_model=64, n_heads=8)  # JapaneseVowels size
    assert sum(p.numel() for p in uea.parameters()) == reference_count(64, 8, 8)


def test_forward_backward_smoke():
    m = make(window_size=4).train()  # dropout 0.1 (LongformerConfig's attention_probs_dropout_prob)
    x, mask = batch(19, True)
    x.requires_grad_(True)
    m(x, mask)[mask].pow(2).sum().backward()
    assert torch.isfinite(x.grad).all()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in m.parameters())


def test_registry_entry_options_and_refusals():
    caps = attention_spec("longformer").capabilities
    assert caps.causal and caps.padding_mask and caps.variable_length and not caps.cross
    m = make()
    assert (m.window_size, m.global_tokens, m.dropout) == (128, 1, 0.1)
    with pytest.raises(TypeError, match="num_hashes"):
        make(num_hashes=2)
    with pytest.raises(ValueError, match="even"):
        make(window_size=5)
    x, mask = batch(6, True)
    with pytest.raises(ValueError, match="cannot attend to a context"):
        m(x, mask, context=x)
