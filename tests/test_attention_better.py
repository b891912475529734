"""papers/002 (Section 3): Standard / Optimised / Efficient / Super attention against Eqn. 1-23."""
from __future__ import annotations

import math

import pytest
import torch

from attnbench.models.attention import build_attention


pytestmark = pytest.mark.usefixtures("float64_single_thread")


def n_params(module):
    return sum(p.numel() for p in module.parameters())


# Per attention layer, as the paper's tables print them.
PAPER_COUNTS = [
    (128, 64, {"standard": 66_048, "optimised": 49_536, "efficient": 33_024, "super": 37_184}),  # MNIST
    (32, 32, {"standard": 4_224, "optimised": 3_168, "efficient": 2_112, "super": 3_168}),  # IMDB
    (256, 257, {"standard": 263_168, "optimised": 197_376, "efficient": 131_584, "super": 197_890}),  # CIFAR100
]

# The projections each variant keeps (Def. 1: W^Q, W^K, W^V, W^O; Def. 2 drops W^V; Def. 3 and 4 also W^K).
KEPT = {"standard": 4, "optimised": 3, "efficient": 2, "super": 2}


def paper_tensor_shapes(name, d_model, context):
    """The trainable tensors of one layer by the definitions: each kept projection a d_m x d_m
    matrix and a bias of d_m (the Dense layers of the paper's keras models); Super adds the l x l
    alignment kernel W^A and its bias of l (Eqn. 22)."""
    shapes = [(d_model, d_model), (d_model,)] * KEPT[name]
    if name == "super":
        shapes += [(context, context), (context,)]
    return shapes


@pytest.mark.parametrize("d_model,context,counts", PAPER_COUNTS)
def test_parameter_counts_match_the_paper(d_model, context, counts):
    for name, printed in counts.items():
        opts = {"max_len": context} if name == "super" else {}
        m = build_attention(name, d_model=d_model, n_heads=4, **opts)
        shapes = paper_tensor_shapes(name, d_model, context)
        assert sorted(tuple(p.shape) for p in m.parameters()) == sorted(shapes), name
        derived = sum(math.prod(shape) for shape in shapes)
        assert n_params(m) == derived == printed, (name, n_params(m), derived, printed)


def test_parameter_names():
    names = {n: {k.split(".")[0] for k, _ in build_attention(n, d_model=8, n_heads=2, **o).named_parameters()}
             for n, o in [("standard", {}), ("optimised", {}), ("efficient", {}), ("super", {"max_len": 5})]}
    assert names["standard"] == {"q_proj", "k_proj", "v_proj", "out_proj"}
    assert names["optimised"] == {"q_proj", "k_proj", "out_proj"}
    assert names["efficient"] == {"q_proj", "out_proj"}
    assert names["super"] == {"q_proj", "out_proj", "align"}
    m = build_attention("super", d_model=8, n_heads=2, max_len=5)
    assert isinstance(m.align, torch.nn.Linear) and m.align.weight.shape == (5, 5) and m.align.bias.shape == (5,)


def reference_better(m, name, x, mask, causal):
    """O = (H_1 .. H_h) W^O; H_i = S_i V'_i; S_i = softmax(Q'_i K'_i^T / sqrt(d_k)), per head, naive."""
    b_size, n, d_m = x.shape
    h_count = m.n_heads
    d_k = d_m // h_count
    heads = []
    for i in range(h_count):
        cols = slice(i * d_k, (i + 1) * d_k)

        def proj(linear, cols=cols):  # X W_i + b_i with W_i the columns of head i (nn.Linear stores W^T)
            return x @ linear.weight[cols].T + linear.bias[cols]

        q = proj(m.q_proj)  # Eqn. 6 / 12 / 16 / 23
        k = proj(m.k_proj) if name in ("standard", "optimised") else x[..., cols]  # Eqn. 5, 11 vs K_i
        v = proj(m.v_proj) if name == "standard" else x[..., cols]  # Eqn. 4 vs V_i
        if name == "super":  # Eqn. 22: V'_i = W^A V_i (+ bias), W^A lower-triangular when causal
            if mask is not None:
                v = v * mask[..., None]
            w_a = m.align.weight[:n, :n]
            if causal:
                w_a = torch.tril(w_a)
            v = torch.stack([w_a @ v[b] + m.align.bias[:n, None] for b in range(b_size)])
        logits = q @ k.transpose(1, 2) / math.sqrt(d_k)
        if mask is not None:
            logits = logits.masked_fill(~mask[:, None, :], -math.inf)
        if causal:
            logits = logits.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), -math.inf)
        heads.append(torch.softmax(logits, -1) @ v)  # H_i = S_i V_i
    return torch.cat(heads, -1) @ m.out_proj.weight.T + m.out_proj.bias  # Eqn. 1


@pytest.mark.parametrize("name", ["standard", "optimised", "efficient", "super"])
@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("causal", [False, True])
def test_matches_equations(name, padded, causal):
    torch.manual_seed(0)
    opts = {"max_len": 9} if name == "super" else {}
    m = build_attention(name, d_model=12, n_heads=3, **opts).eval()
    x = torch.randn(2, 9, 12)
    mask = None
    if padded:
        mask = torch.ones(2, 9, dtype=torch.bool)
        mask[1, 6:] = False
        mask[0, 1] = False
    got = m(x, mask, causal=causal)
    want = reference_better(m, name, x, mask, causal)
    rows = slice(None) if mask is None else mask
    torch.testing.assert_close(got[rows], want[rows])


def test_standard_is_softmax():
    torch.manual_seed(0)
    a = build_attention("softmax", d_model=8, n_heads=2)
    b = build_attention("standard", d_model=8, n_heads=2)
    b.load_state_dict(a.state_dict())
    x = torch.randn(2, 7, 8)
    torch.testing.assert_close(a(x), b(x))


def test_super_shorter_input_equals_right_padding_to_context_length():
    torch.manual_seed(0)
    m = build_attention("super", d_model=8, n_heads=2, max_len=10).eval()
    x = torch.randn(2, 7, 8)
    padded = torch.cat([x, torch.randn(2, 3, 8)], 1)
    mask = torch.arange(10)[None].expand(2, -1) < 7
    for causal in (False, True):
        torch.testing.assert_close(m(x, causal=causal), m(padded, mask, causal=causal)[:, :7])


def test_super_rejects_longer_input_and_needs_max_len():
    m = build_attention("super", d_model=8, n_heads=2, max_len=4)
    with pytest.raises(ValueError, match="context length"):
        m(torch.randn(1, 5, 8))
    with pytest.raises(ValueError, match="max_len"):
        build_attention("super", d_model=8, n_heads=2)
    with pytest.raises(TypeError, match="max_len"):
        build_attention("efficient", d_model=8, n_heads=2, max_len=4)


def test_super_causal_alignment_kernel_is_lower_triangular():
    torch.manual_seed(0)
    m = build_attention("super", d_model=8, n_heads=2, max_len=6).eval()
    x = torch.randn(1, 6, 8)
    base = m(x, causal=True)
    y = x.clone()
    y[0, 4] += 1.0
    out = m(y, causal=True)
    torch.testing.assert_close(out[0, :4], base[0, :4])
    assert not torch.allclose(out[0, 4:], base[0, 4:])
    # without causality W^A mixes later tokens into earlier ones
    assert not torch.allclose(m(y)[0, :4], m(x)[0, :4])
