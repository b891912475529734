"""Linformer against a transcription of the LRA code that produced the published numbers
(mlpen/Nystromformer LRA/code/attention.py ``Attention`` + attention_linformer.py, identical in
yingyichen-cyy/PrimalAttention PrimalAttention_LRA/*/attentions/), on copied weights (float64)."""
from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf

from attnbench.models.attention import attention_spec, build_attention
from attnbench.models.attention.linformer import share_projection_across_layers
from attnbench.models.attention.reference.linformer import code_attention

pytestmark = pytest.mark.usefixtures("float64_single_thread")
D_MODEL, HEADS, K, MAX_LEN = 8, 2, 3, 7


def make(**options):
    torch.manual_seed(0)
    return build_attention("linformer", d_model=D_MODEL, n_heads=HEADS,
                           **{"linformer_k": K, "max_len": MAX_LEN, **options}).eval()


def padded_batch(n=MAX_LEN):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, n, D_MODEL, generator=g)
    mask = torch.ones(2, n, dtype=torch.bool)
    mask[0, n - 2:] = False  # right padding
    mask[1, [1, 4]] = False  # holes
    return x, mask


# --- the computation ------------------------------------------------------------------------------
def test_output_matches_the_lra_code_padded_and_unpadded():
    m = make()
    x, mask = padded_batch()
    torch.testing.assert_close(m(x, mask)[mask], code_attention(m, x, mask)[mask])
    torch.testing.assert_close(m(x), code_attention(m, x, torch.ones(2, MAX_LEN)))  # no mask = all real


def test_shorter_input_equals_the_reference_on_the_input_padded_to_max_len():
    """The LRA loader pads every sequence to max_seq_len; a shorter input uses E's first columns."""
    m = make()
    x = torch.randn(2, 4, D_MODEL)
    padded = torch.cat([x, torch.randn(2, MAX_LEN - 4, D_MODEL)], dim=1)
    mask = torch.arange(MAX_LEN)[None].expand(2, -1) < 4
    torch.testing.assert_close(m(x), code_attention(m, padded, mask)[:, :4])


def test_padded_content_never_reaches_real_outputs():
    m = make()
    x, mask = padded_batch()
    noisy = torch.where(mask[..., None], x, 100 * torch.randn_like(x))
    torch.testing.assert_close(m(noisy, mask)[mask], m(x, mask)[mask])


def test_refusals():
    m = make()
    with pytest.raises(ValueError, match="max_len=7"):
        m(torch.randn(1, MAX_LEN + 1, D_MODEL))
    with pytest.raises(ValueError, match="cannot run causally"):
        m(torch.randn(1, 4, D_MODEL), causal=True)
    with pytest.raises(ValueError, match="cannot attend to a context"):
        m(torch.randn(1, 4, D_MODEL), context=torch.randn(1, 4, D_MODEL))
    with pytest.raises(ValueError, match="max_len"):
        build_attention("linformer", d_model=D_MODEL, n_heads=HEADS)
    with pytest.raises(TypeError, match="num_landmarks"):
        make(num_landmarks=4)
    caps = attention_spec("linformer").capabilities
    assert caps.sized_by_max_len and not caps.variable_length and not caps.causal and not caps.cross


def test_projection_init_and_roles_pass_the_task_length():
    from attnbench.models.roles import build_layer_attentions

    m = make(linformer_k=64, max_len=300)
    assert m.projection.shape == (HEADS, 64, 300)
    assert abs(m.projection.std().item() - 0.02) < 0.002  # normal_(std = 0.02)
    cfg = OmegaConf.create({"attention": {"name": "linformer"}})
    layers = build_layer_attentions(cfg, 2, D_MODEL, HEADS, seq_len=29)
    assert [(a.max_len, a.linformer_k) for a in layers] == [(29, 256), (29, 256)]


# --- parameters -----------------------------------------------------------------------------------
def n_params(*modules):
    """Parameters of the modules, a shared one counted once (as model.parameters() does)."""
    unique = {id(p): p for mod in modules for p in mod.parameters()}
    return sum(p.numel() for p in unique.values())


@pytest.mark.parametrize("dim,heads,max_seq_len", [
    (64, 2, 2048),  # LRA ListOps: dim 64, num_head 2 (head_dim 32), max_seq_len 2000 -> 2^11 (run_tasks.py:34)
    (64, 8, 29),  # UEA JapaneseVowels: d_model 64, 8 heads, length 29
])
def test_parameter_counts_match_the_reference(dim, heads, max_seq_len):
    linear = dim * dim + dim  # W_q, W_k, W_v (num_head * head_dim = dim) and ff, all with bias
    e = heads * 256 * max_seq_len  # E: nn.Parameter(num_head, linformer_k = 256, max_seq_len)
    torch.manual_seed(0)
    layers = [build_attention("linformer", d_model=dim, n_heads=heads, max_len=max_seq_len) for _ in range(2)]
    assert n_params(layers[0]) == 4 * linear + e  # one Attention module
    share_projection_across_layers(layers)
    # the reference's E is a class attribute: one E for the whole 2-layer model
    assert n_params(*layers) == 2 * 4 * linear + e
    assert layers[1].projection is layers[0].projection


def test_forward_backward_finite():
    m = make().train()
    x, mask = padded_batch()
    x.requires_grad_(True)
    m(x, mask)[mask].pow(2).sum().backward()
    assert torch.isfinite(x.grad).all()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in m.parameters())
