"""SOFT (models/attention/soft.py) against a transcription of the 1D port in mlpen/mra-attention
``old_code/LRA/encoders/soft.py`` (``SoftmaxFreeAttention.forward`` + ``SoftmaxFreeAttentionKernel``:
Q, V times the mask, Q / d^(1/4), Conv1d landmarks + LayerNorm + GELU, ``torch.cdist(...) ** 2``
Gaussian kernels, ``newton_inv`` with fudan-zvg/SOFT's start and mlpen's 1e4 stop, the (k x 1)
depthwise conv of V), on the module's weights, float64.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn
from omegaconf import OmegaConf

from attnbench.models.attention import attention_spec, build_attention
from attnbench.models.attention.soft import newton_pseudo_inverse
from attnbench.models.attention.reference.soft import code_newton_inv, code_soft

pytestmark = pytest.mark.usefixtures("float64_single_thread")

D_MODEL, HEADS, LENGTH = 8, 2, 13


def make(**options):
    torch.manual_seed(0)
    options = {"max_len": LENGTH, "num_landmarks": 4, **options}  # ratio 3, 13 // 3 = 4 landmarks
    return build_attention("soft", d_model=D_MODEL, n_heads=HEADS, **options).eval()


def inputs(batch=2, length=LENGTH, padded=True, seed=1):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, length, D_MODEL, generator=g)
    if not padded:
        return x, None
    mask = torch.ones(batch, length, dtype=torch.bool)
    mask[0, length - 4:] = False  # right padding
    mask[1, [2, 7]] = False  # holes
    return x, mask


# ------------------------------------------------------------------ tests


@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("conv", [0, 3])
@pytest.mark.parametrize("length", [LENGTH, 12])  # 13: the conv drops the last token; 12 = 4 x 3
def test_matches_the_reference_code(padded, conv, length):
    m = make(conv_kernel_size=conv)
    x, mask = inputs(length=length, padded=padded)
    got = m(x, mask)
    want = code_soft(m, x, mask)
    rows = slice(None) if mask is None else mask
    torch.testing.assert_close(got[rows], want[rows], rtol=1e-8, atol=1e-10)


def test_padding_ignore_is_the_unmasked_code():
    m = make(padding="ignore", conv_kernel_size=3)
    x, mask = inputs()
    torch.testing.assert_close(m(x, mask), code_soft(m, x), rtol=1e-8, atol=1e-10)


def test_padded_content_never_reaches_real_outputs():
    m = make(conv_kernel_size=3)
    x, mask = inputs()
    noisy = torch.where(mask[..., None], x, 50 * torch.randn_like(x))
    torch.testing.assert_close(m(noisy, mask)[mask], m(x, mask)[mask])


def test_newton_iterations_reach_the_pseudo_inverse():
    """Well-conditioned Gaussian landmark kernels: 20 iterations give B^+ (= B^-1 here)."""
    g = torch.Generator().manual_seed(0)
    points = 2.0 * torch.randn(2, 3, 5, 4, generator=g)
    kernel = torch.exp(-torch.cdist(points, points) ** 2 / 2)
    torch.testing.assert_close(newton_pseudo_inverse(kernel, 40), torch.linalg.pinv(kernel), rtol=1e-6, atol=1e-8)
    torch.testing.assert_close(newton_pseudo_inverse(kernel, 20), code_newton_inv(kernel, 20))


def test_newton_stops_before_blowing_up():
    """mlpen's stop: an iterate above 1e4 in absolute value ends the loop, the last one is kept."""
    near_singular = torch.tensor([[1.0, 1.0 - 1e-9], [1.0 - 1e-9, 1.0]])
    got = newton_pseudo_inverse(near_singular, 100)
    assert got.abs().max() <= 1e4
    torch.testing.assert_close(newton_pseudo_inverse(near_singular, 200), got)  # stopped, not converged
    torch.testing.assert_close(got, code_newton_inv(near_singular, 100))


def test_causal_is_refused_with_the_reason():
    x, mask = inputs()
    with pytest.raises(ValueError, match="cannot run causally: the landmarks pool"):
        make()(x, mask, causal=True)
    with pytest.raises(ValueError, match="cannot attend to a context"):
        make()(x, mask, context=x, context_mask=mask)


def reference_parameter_count(dim, num_head, max_seq_len, num_landmarks, conv_kernel_size):
    """SoftmaxFreeAttention (mlpen soft.py): W_q, W_v, ff = nn.Linear(dim, dim) with bias; the
    kernel's Qlandmark_op = Conv1d(head_dim, head_dim, ratio, stride=ratio, bias=False) with
    ratio = max_seq_len // num_landmarks, Qnorm_act = LayerNorm(head_dim) + GELU, and, for
    conv_kernel_size > 0, Conv2d(num_head, num_head, (k, 1), groups=num_head, bias=False)."""
    head_dim = dim // num_head
    ratio = max_seq_len // num_landmarks
    linears = 3 * (dim * dim + dim)
    landmarks = head_dim * head_dim * ratio + 2 * head_dim
    conv = num_head * conv_kernel_size
    return linears + landmarks + conv


@pytest.mark.parametrize("conv", [0, 33])  # mlpen LRA/models/soft/64 and 64-conv
def test_parameter_count_lra(conv):
    """mlpen LRA ListOps: dim 64, num_head 2 x head_dim 32, max_seq_len 2000, num_landmarks 64."""
    m = build_attention("soft", d_model=64, n_heads=2, max_len=2000, num_landmarks=64, conv_kernel_size=conv)
    assert m.ratio == 31
    expected = reference_parameter_count(64, 2, 2000, 64, conv)
    assert sum(p.numel() for p in m.parameters()) == expected == 12480 + 31 * 32 * 32 + 64 + 2 * conv


def test_parameter_count_uea():
    """UEA JapaneseVowels: d_model 64, 8 heads, length 29. With 8 landmarks the reference builds
    (ratio 3); with its 64 it cannot (kernel_size 29 // 64 = 0), where ratio is taken as 1."""
    m = build_attention("soft", d_model=64, n_heads=8, max_len=29, num_landmarks=8)
    assert sum(p.numel() for p in m.parameters()) == reference_parameter_count(64, 8, 29, 8, 0) == 12688
    m = build_attention("soft", d_model=64, n_heads=8, max_len=29)
    assert m.ratio == 1 and sum(p.numel() for p in m.parameters()) == 12480 + 8 * 8 + 16
    x = torch.randn(2, 29, 64)
    assert m(x).shape == x.shape  # every token its own landmark window: 29 landmarks


def test_task_length_sizes_the_landmark_conv():
    """sized_by_max_len: models.roles passes the task's length as max_len."""
    from attnbench.models.roles import build_layer_attentions

    cfg = OmegaConf.create({"attention": {"name": "soft"}})
    (m,) = build_layer_attentions(cfg, 1, 64, 2, seq_len=1024)
    assert m.max_len == 1024 and m.ratio == 16 and m.landmark_conv.weight.shape == (32, 32, 16)


def test_short_sequence_is_refused_clearly():
    m = make(max_len=40, num_landmarks=4)  # ratio 10
    with pytest.raises(ValueError, match="shorter than one landmark window"):
        m(torch.randn(1, 9, D_MODEL))


def test_forward_backward_finite():
    m = make(conv_kernel_size=3).float().train()
    x, mask = inputs()
    x = x.float().requires_grad_(True)
    m(x, mask)[mask].pow(2).sum().backward()
    assert torch.isfinite(x.grad).all()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in m.parameters())


def test_capabilities_and_options():
    caps = attention_spec("soft").capabilities
    assert not caps.causal and caps.padding_mask and not caps.cross and caps.sized_by_max_len
    with pytest.raises(TypeError, match="source_clamp"):
        build_attention("soft", d_model=8, n_heads=2, source_clamp=1.0)
    for bad in ({"conv_kernel_size": 4}, {"padding": "valid"}, {"num_landmarks": 0}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            build_attention("soft", d_model=8, n_heads=2, **bad)
    assert "k_proj" not in dict(make().named_modules())  # K = Q: no key projection, as the reference
    assert isinstance(make(conv_kernel_size=5).value_conv, nn.Conv2d)
