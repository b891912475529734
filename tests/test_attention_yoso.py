"""YOSO-E (models/attention/yoso.py) against a float64 transcription of mlpen/YOSO's ``YOSOEAttention``
(encoders/backbones/efficient_attentions/yoso/yoso_v1/yoso.py) and its ``Cumulation`` autograd
function (yoso_v1/kernel.py), inside the LRA ``Attention`` (encoders/backbones/efficient_attention.py:
W_q, W_k, W_v, split_heads, attention, combine_heads, ff), on the module's weights: forward outputs
and the gradients of the reference's approximate backward."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from attnbench.models.attention import attention_spec, build_attention
from attnbench.models.attention.reference.yoso import code_yoso_e

pytestmark = pytest.mark.usefixtures("float64_single_thread")
D_MODEL, HEADS = 8, 2


def make(**options):
    torch.manual_seed(0)
    return build_attention("yoso_e", d_model=D_MODEL, n_heads=HEADS, **options).eval()


def batch(n, seed=1):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2, n, D_MODEL, generator=g)
    mask = torch.ones(2, n, dtype=torch.bool)
    mask[0, n - 3:] = False
    mask[1, [0, 4]] = False
    return x, mask


def grads(output_fn, m, x, mask):
    loss = (output_fn()[mask] * torch.linspace(-1, 1, D_MODEL)).sin().sum()
    return torch.autograd.grad(loss, [x] + [p for p in m.parameters()])


# --------------------------------------------------------------------------- tests


@pytest.mark.parametrize("tau,conv_window,causal", [(9, None, False), (11, None, False), (4, 3, False),
                                                    (9, None, True), (11, None, True)])  # conv: not causal
def test_output_and_gradients_match_the_reference(tau, conv_window, causal):
    m = make(hash_code_len=tau, conv_window=conv_window)
    x, mask = batch(7)
    x.requires_grad_(True)
    out = m(x, mask, causal=causal)
    expected = code_yoso_e(m, x, mask, causal=causal)
    torch.testing.assert_close(out[mask], expected[mask])
    for ours, theirs in zip(grads(lambda: m(x, mask, causal=causal), m, x, mask),
                            grads(lambda: code_yoso_e(m, x, mask, causal=causal), m, x, mask)):
        torch.testing.assert_close(ours, theirs)


def test_unpadded_batch_matches_and_gradient_is_the_approximate_one():
    m = make()
    x, mask = batch(6)
    full = torch.ones_like(mask)
    x.requires_grad_(True)
    torch.testing.assert_close(m(x), code_yoso_e(m, x, full))
    ours = grads(lambda: m(x), m, x, full)
    # exact autograd through arccos differs: the reference trains with dE/dcos = (tau/2) E
    exact = make()

    def exact_forward():
        h, d = exact.n_heads, exact.d_head
        q = F.normalize((x @ exact.q_proj.weight.T + exact.q_proj.bias).view(2, 6, h, d).transpose(1, 2), dim=-1)
        k = F.normalize((x @ exact.k_proj.weight.T + exact.k_proj.bias).view(2, 6, h, d).transpose(1, 2), dim=-1)
        v = (x @ exact.v_proj.weight.T + exact.v_proj.bias).view(2, 6, h, d).transpose(1, 2)
        e = (1 - torch.acos(q @ k.transpose(-1, -2)) / math.pi) ** exact.hash_code_len
        out = F.normalize(e @ v, dim=-1).transpose(1, 2).reshape(2, 6, D_MODEL)
        return out @ exact.out_proj.weight.T + exact.out_proj.bias

    torch.testing.assert_close(exact_forward(), m(x))
    assert not torch.allclose(grads(exact_forward, exact, x, full)[0], ours[0])


def test_cross_attention_matches_the_reference():
    m = make()
    x, mask = batch(5)
    context, context_mask = batch(8, seed=2)
    out = m(x, mask, context=context, context_mask=context_mask)
    torch.testing.assert_close(out[mask], code_yoso_e(m, x, mask, context, context_mask)[mask])


def test_causal_later_tokens_never_change_earlier_outputs():
    m = make()
    x, mask = batch(9)
    base = m(x, mask, causal=True)
    for t in (1, 4, 8):
        y = x.clone()
        y[:, t:] = 10 * torch.randn(2, 9 - t, D_MODEL)
        torch.testing.assert_close(m(y, mask, causal=True)[:, :t], base[:, :t])


@pytest.mark.parametrize("causal,conv_window", [(False, None), (True, None), (False, 3)])
def test_padded_positions_do_not_reach_real_outputs(causal, conv_window):
    m = make(conv_window=conv_window)
    x, mask = batch(9)
    base = m(x, mask, causal=causal)
    noisy = torch.where(mask[..., None], x, 50 * torch.randn_like(x))
    torch.testing.assert_close(m(noisy, mask, causal=causal)[mask], base[mask])


def test_parameter_counts_equal_the_reference():
    """mlpen/YOSO Attention: W_q, W_k, W_v, ff = nn.Linear with bias (dim -> heads * head_dim and
    back); YOSOEAttention has parameters only with conv_window: Conv2d(h, h, (w, 1), groups=h,
    bias=False) = h * w weights."""

    def reference_count(dim, heads, head_dim, conv_window=None):
        inner = heads * head_dim
        conv = heads * conv_window if conv_window else 0
        return 3 * (dim * inner + inner) + (inner * dim + dim) + conv

    lra = build_attention("yoso_e", d_model=64, n_heads=2)  # LRA config: dim 64, 2 heads of 32
    assert sum(p.numel() for p in lra.parameters()) == reference_count(64, 2, 32) == 16_640
    uea = build_attention("yoso_e", d_model=64, n_heads=8)  # JapaneseVowels size
    assert sum(p.numel() for p in uea.parameters()) == reference_count(64, 8, 8)
    conv = build_attention("yoso_e", d_model=64, n_heads=2, conv_window=35)
    assert sum(p.numel() for p in conv.parameters()) == reference_count(64, 2, 32, 35)


def test_forward_backward_smoke_float32_with_dropout():
    m = make(dropout=0.1).float().train()
    x, mask = batch(12)
    x = x.float().requires_grad_(True)
    m(x, mask)[mask].pow(2).sum().backward()
    assert torch.isfinite(x.grad).all()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in m.parameters())
    # identical query and key directions (cosine rounded past 1) stay finite
    m.k_proj.load_state_dict(m.q_proj.state_dict())
    assert torch.isfinite(m(x, mask)).all()


def test_registry_entry_options_and_refusals():
    caps = attention_spec("yoso_e").capabilities
    assert caps.causal and caps.padding_mask and caps.variable_length and caps.cross
    m = make()
    assert (m.hash_code_len, m.conv_window, m.dropout) == (9, None, 0.0)
    with pytest.raises(TypeError, match="num_hash"):
        make(num_hash=32)
    x, mask = batch(5)
    with pytest.raises(ValueError, match="causal"):
        make(conv_window=3)(x, mask, causal=True)
    with pytest.raises(ValueError, match="cannot attend to a context"):
        make(conv_window=3)(x, mask, context=x)
