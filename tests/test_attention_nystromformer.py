"""Nystromformer against a transcription of the LRA code that produced the published numbers
(mlpen/Nystromformer LRA/code/attention.py ``Attention`` + attention_nystrom.py; the PrimalFormer
copy in yingyichen-cyy/PrimalAttention reads max_seq_len for seq_len), on copied weights (float64)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from attnbench.models.attention import attention_spec, build_attention
from attnbench.models.attention.base import depthwise_sequence_conv
from attnbench.models.attention.nystromformer import iterative_pinv
from attnbench.models.attention.reference.nystromformer import code_attention

pytestmark = pytest.mark.usefixtures("float64_single_thread")
D_MODEL, HEADS, LANDMARKS, CONV = 8, 2, 4, 5


def make(**options):
    torch.manual_seed(0)
    m = build_attention("nystromformer", d_model=D_MODEL, n_heads=HEADS,
                        **{"num_landmarks": LANDMARKS, "conv_kernel_size": CONV, **options}).eval()
    with torch.no_grad():  # a conv large enough to matter in the comparisons
        if hasattr(m, "conv"):
            m.conv.weight.normal_()
    return m


def padded_batch(n):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, n, D_MODEL, generator=g)
    mask = torch.ones(2, n, dtype=torch.bool)
    mask[0, n - 3:] = False  # right padding
    mask[1, [0, 5]] = False  # holes
    return x, mask


# --- the computation ------------------------------------------------------------------------------
@pytest.mark.parametrize("pinv_init", ["original", "per_matrix"])
@pytest.mark.parametrize("n", [12, 4])  # landmark branch (segments of 3) / n == num_landmarks: exact softmax
def test_output_matches_the_lra_code_padded_and_unpadded(n, pinv_init):
    m = make(pinv_init=pinv_init)
    if n > LANDMARKS:
        x, mask = padded_batch(n)
    else:
        x, mask = torch.randn(2, n, D_MODEL), torch.tensor([[1, 1, 0, 1], [1, 1, 1, 0]]).bool()
    torch.testing.assert_close(m(x, mask)[mask], code_attention(m, x, mask)[mask])
    torch.testing.assert_close(m(x), code_attention(m, x, torch.ones(2, n)))


def test_without_conv_and_with_other_iterations():
    m = make(conv_kernel_size=None, pinv_iterations=6)
    assert not hasattr(m, "conv")
    x, mask = padded_batch(12)
    torch.testing.assert_close(m(x, mask)[mask], code_attention(m, x, mask)[mask])


@pytest.mark.parametrize("n,padded_to", [(10, 12), (3, 4)])
def test_other_lengths_equal_the_reference_on_the_input_padded_to_a_multiple(n, padded_to):
    """The reference needs seq_len % num_landmarks == 0; other lengths are padded (masked) inside
    the layer, which is the reference on the input right-padded that far (n < m: exact softmax)."""
    m = make()
    x = torch.randn(2, n, D_MODEL)
    mask = torch.ones(2, n, dtype=torch.bool)
    mask[1, 0] = False
    padded = torch.cat([x, torch.randn(2, padded_to - n, D_MODEL)], dim=1)
    padded_mask = torch.cat([mask, torch.zeros(2, padded_to - n, dtype=torch.bool)], dim=1)
    expected = code_attention(m, padded, padded_mask)[:, :n]
    torch.testing.assert_close(m(x, mask)[mask], expected[mask])


def test_iterative_pinv_approaches_the_pseudo_inverse():
    a = torch.softmax(torch.randn(2, 3, 5, 5), dim=-1)
    torch.testing.assert_close(iterative_pinv(a, 40, "per_matrix"), torch.linalg.pinv(a))


def test_original_init_couples_the_sequences_of_a_batch():
    """Z_0's scale is the max over the whole batch in the reference's default init: a second
    sequence with peakier landmark softmaxes changes the first one's output."""
    x, mask = padded_batch(12)
    x[1] *= 5
    for init, coupled in (("original", True), ("per_matrix", False)):
        m = make(pinv_init=init)
        alone, together = m(x[:1], mask[:1]), m(x, mask)[:1]
        assert torch.allclose(alone, together) != coupled, init


def test_padded_content_never_reaches_real_outputs():
    m = make()
    for n in (12, 10):
        x, mask = padded_batch(n)
        noisy = torch.where(mask[..., None], x, 100 * torch.randn_like(x))
        torch.testing.assert_close(m(noisy, mask)[mask], m(x, mask)[mask])


def test_refusals():
    m = make()
    with pytest.raises(ValueError, match="cannot run causally"):
        m(torch.randn(1, 8, D_MODEL), causal=True)
    with pytest.raises(ValueError, match="cannot attend to a context"):
        m(torch.randn(1, 8, D_MODEL), context=torch.randn(1, 8, D_MODEL))
    with pytest.raises(ValueError, match="odd"):
        make(conv_kernel_size=4)
    with pytest.raises(ValueError, match="pinv_init"):
        make(pinv_init="exact")
    with pytest.raises(TypeError, match="linformer_k"):
        make(linformer_k=4)
    caps = attention_spec("nystromformer").capabilities
    assert caps.variable_length and caps.padding_mask and not caps.causal and not caps.cross


# --- parameters -----------------------------------------------------------------------------------
@pytest.mark.parametrize("dim,heads", [(64, 2), (64, 8)])  # LRA (head_dim 32) / UEA JapaneseVowels (d 64, 8 heads)
def test_parameter_counts_match_the_reference(dim, heads):
    linear = dim * dim + dim  # W_q, W_k, W_v, ff, all with bias
    conv = heads * 1 * 35 * 1  # Conv2d(num_head, num_head, (35, 1), groups = num_head, bias = False)
    m = build_attention("nystromformer", d_model=dim, n_heads=heads)
    assert sum(p.numel() for p in m.parameters()) == 4 * linear + conv
    assert m.num_landmarks == 64 and m.conv.weight.shape == (heads, 1, 35, 1)


def test_forward_backward_finite():
    m = make().train()
    x, mask = padded_batch(10)
    x.requires_grad_(True)
    m(x, mask)[mask].pow(2).sum().backward()
    assert torch.isfinite(x.grad).all()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in m.parameters())


@pytest.mark.parametrize("k", [1, 4, 35])
def test_value_convolution_is_the_references_conv2d(k):
    """The k shifted multiply-adds (and their hand-written backward) equal nn.Conv2d(H, H, (k, 1),
    padding=(k // 2, 0), groups=H) of the reference on values in split_heads' layout."""
    v = torch.randn(2, 40, 3, 5).transpose(1, 2).requires_grad_()
    w = torch.randn(3, 1, k, 1, requires_grad=True)
    expected = F.conv2d(v, w, padding=(k // 2, 0), groups=3)
    out = depthwise_sequence_conv(v, w)
    torch.testing.assert_close(out, expected)
    g = torch.randn_like(expected)
    for ours, theirs in zip(torch.autograd.grad((out * g).sum(), (v, w)), torch.autograd.grad((expected * g).sum(), (v, w))):
        torch.testing.assert_close(ours, theirs)
    assert torch.autograd.gradcheck(depthwise_sequence_conv, (v[:1, :, :7].detach().requires_grad_(), w))
