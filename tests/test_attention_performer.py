"""Performer against a transcription of the LRA code that produced the published numbers
(mlpen/Nystromformer LRA/code/attention.py ``Attention`` + attention_performer.py, calling
lucidrains/performer-pytorch FastAttention as of early 2021: softmax_kernel with the keys' max over
the whole batch, linear_attention; causal_linear_attention for the causal form), on copied
weights and the module's random matrix (float64); plus the seeded redraws."""
from __future__ import annotations

import pytest
import torch

from attnbench.models.attention import attention_spec, build_attention
from attnbench.models.attention.performer import orthogonal_gaussian_matrix, softmax_features
from attnbench.models.attention.reference.performer import code_attention, code_gaussian_orthogonal_random_matrix

pytestmark = pytest.mark.usefixtures("float64_single_thread")
D_MODEL, HEADS, FEATURES = 8, 2, 10  # d_head 4: two full orthogonal blocks and a partial one


def make(**options):
    torch.manual_seed(0)
    return build_attention("performer", d_model=D_MODEL, n_heads=HEADS,
                           **{"nb_features": FEATURES, **options}).eval()


def padded_batch(n=11, left_padding=False):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, n, D_MODEL, generator=g)
    mask = torch.ones(2, n, dtype=torch.bool)
    mask[0, n - 3:] = False
    mask[1, [1, 4] if not left_padding else [0, 1]] = False
    return x, mask


# --- the computation ------------------------------------------------------------------------------
@pytest.mark.parametrize("feature_map", ["softmax", "relu"])
@pytest.mark.parametrize("causal", [False, True])
def test_output_matches_the_reference_padded_and_unpadded(feature_map, causal):
    m = make(feature_map=feature_map)
    x, mask = padded_batch(70)  # causal: more than one chunk of 64 keys
    torch.testing.assert_close(m(x, mask, causal=causal)[mask], code_attention(m, x, mask, causal)[mask])
    ones = torch.ones(2, 70, dtype=torch.bool)
    torch.testing.assert_close(m(x, causal=causal), code_attention(m, x, ones, causal))


@pytest.mark.parametrize("causal", [False, True])
def test_gradients_match_the_reference(causal):
    """The features' hand-written backward (stabiliser included) against autograd through the reference."""
    m = make()
    x, mask = padded_batch(70)
    x.requires_grad_(True)
    weights = torch.linspace(-1, 1, D_MODEL)

    def grads(forward):
        loss = (forward()[mask] * weights).sin().sum()
        return torch.autograd.grad(loss, [x, *m.parameters()])

    for ours, theirs in zip(grads(lambda: m(x, mask, causal=causal)), grads(lambda: code_attention(m, x, mask, causal))):
        torch.testing.assert_close(ours, theirs)


@pytest.mark.parametrize("shift", ["row", "batch_max", "zero"])
def test_feature_backward_passes_gradcheck(shift):
    torch.manual_seed(0)
    x = torch.randn(2, 2, 5, 4, requires_grad=True)
    projection = torch.randn(6, 4)
    valid = torch.tensor([[True] * 5, [True, True, False, True, False]])
    for keys in (None, valid) if shift == "batch_max" else (None,):
        assert torch.autograd.gradcheck(lambda t, keys=keys: softmax_features(t, projection, shift == "row", shift, keys), (x,))


def test_cross_attention_matches_the_reference():
    m = make()
    x, mask = padded_batch(5)
    context, context_mask = padded_batch(9)
    out = m(x, mask, context=context, context_mask=context_mask)
    torch.testing.assert_close(out, code_attention(m, x, mask, context=context, context_mask=context_mask))


def test_random_matrix_is_performer_pytorchs():
    g1, g2 = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    ours = orthogonal_gaussian_matrix(FEATURES, 4, g1)
    torch.testing.assert_close(ours, code_gaussian_orthogonal_random_matrix(FEATURES, 4, g2))
    directions = ours / ours.norm(dim=1, keepdim=True)
    torch.testing.assert_close(directions[:4] @ directions[:4].T, torch.eye(4))  # one block: orthonormal


@pytest.mark.parametrize("padded", [False, True])
def test_causal_outputs_never_see_later_tokens(padded):
    m = make()
    x, mask = padded_batch(70, left_padding=True)
    mask = mask if padded else None
    base = m(x, mask, causal=True)
    for t in (1, 30, 66):
        changed = x.clone()
        changed[:, t:] = 10 * torch.randn(2, 70 - t, D_MODEL)
        out = m(changed, mask, causal=True)
        torch.testing.assert_close(out[:, :t], base[:, :t], msg=f"token {t} leaked backwards")
        assert not torch.allclose(out[:, t:], base[:, t:])


@pytest.mark.parametrize("causal", [False, True])
def test_padded_content_never_reaches_real_outputs(causal):
    m = make()
    x, mask = padded_batch()
    noisy = torch.where(mask[..., None], x, 100 * torch.randn_like(x))
    torch.testing.assert_close(m(noisy, mask, causal=causal)[mask], m(x, mask, causal=causal)[mask])


@pytest.mark.parametrize("causal", [False, True])
def test_excluded_padded_keys_make_padding_change_nothing(causal):
    """padded_keys="excluded": the attention over the real tokens only (the reference formula on a
    sequence without its padded keys), so right padding equals the unpadded sequence."""
    m = make(padded_keys="excluded")
    x, mask = padded_batch()
    for row in range(2):
        real = mask[row]
        out = m(x[row:row + 1], mask[row:row + 1], causal=causal)[0, real]
        if causal:  # keys removed before each query: the unpadded sequence of real tokens
            expected = code_attention(m, x[row:row + 1, real], torch.ones(1, int(real.sum())), causal)[0]
        else:
            expected = code_attention(m, x[row:row + 1], mask[row:row + 1], context=x[row:row + 1, real],
                                      context_mask=torch.ones(1, int(real.sum())))[0, real]
        torch.testing.assert_close(out, expected)
    trimmed = x[:1, :8]  # row 0 is right-padded after 8 tokens
    torch.testing.assert_close(m(x[:1], mask[:1], causal=causal)[:, :8], m(trimmed, causal=causal))
    if not causal:  # the LRA code's zeroed keys do count (causally, right padding comes too late to)
        reference = make()
        assert not torch.allclose(reference(x[:1], mask[:1])[:, :8], reference(trimmed))


def test_fully_padded_context_stays_finite():
    for padded_keys in ("zeroed", "excluded"):
        m = make(padded_keys=padded_keys).float()
        x, _ = padded_batch(5)
        context, context_mask = padded_batch(6)
        context_mask[1] = False
        x, context = x.float().requires_grad_(True), context.float()
        out = m(x, context=context, context_mask=context_mask)
        assert torch.isfinite(out).all()
        out.sum().backward()
        assert torch.isfinite(x.grad).all()


# --- random features: seeding and redraws ---------------------------------------------------------
def test_features_are_seeded():
    a, b = make(), make()
    torch.testing.assert_close(a.projection, b.projection)  # same global seed -> same feature_seed
    torch.manual_seed(0)
    layers = [build_attention("performer", d_model=D_MODEL, n_heads=HEADS) for _ in range(2)]
    assert not torch.allclose(layers[0].projection, layers[1].projection)  # layers draw their own
    fixed = make(feature_seed=7)
    seeded = orthogonal_gaussian_matrix(FEATURES, 4, torch.Generator().manual_seed(7))
    torch.testing.assert_close(fixed.projection, seeded)


def test_no_redraw_by_default():
    m = make().train()
    start = m.projection.clone()
    for _ in range(5):
        m(torch.randn(1, 6, D_MODEL))
    torch.testing.assert_close(m.projection, start)


def test_redraw_every_interval_training_passes_and_resume():
    m = make(redraw_interval=2).train()
    x = torch.randn(1, 6, D_MODEL)
    seen = []
    for _ in range(5):  # passes 1-2: draw 0, passes 3-4: draw 1, pass 5: draw 2
        m(x)
        seen.append(m.projection.clone())
    assert torch.equal(seen[0], seen[1]) and torch.equal(seen[2], seen[3])
    assert not torch.equal(seen[1], seen[2]) and not torch.equal(seen[3], seen[4])
    m.eval()
    for _ in range(3):  # evaluation neither counts nor redraws
        m(x)
    assert torch.equal(m.projection, seen[4]) and int(m.training_passes) == 5

    twin = make(redraw_interval=2).train()  # same seed: the same sequence of draws
    for _ in range(5):
        twin(x)
    torch.testing.assert_close(twin.projection, seen[4])
    resumed = make(redraw_interval=2, feature_seed=123)
    resumed.load_state_dict(m.state_dict())  # a checkpoint carries seed, counters and matrix
    resumed.train()
    m.train()
    for _ in range(2):
        m(x)
        resumed(x)
    torch.testing.assert_close(resumed.projection, m.projection)
    assert not torch.equal(m.projection, seen[4])


# --- parameters and options -----------------------------------------------------------------------
@pytest.mark.parametrize("dim,heads", [(64, 2), (64, 8)])  # LRA (head_dim 32) / UEA JapaneseVowels (d 64, 8 heads)
def test_parameter_counts_match_the_reference(dim, heads):
    linear = dim * dim + dim  # W_q, W_k, W_v, ff, all with bias; FastAttention has no parameters
    m = build_attention("performer", d_model=dim, n_heads=heads)
    assert sum(p.numel() for p in m.parameters()) == 4 * linear
    assert m.projection.shape == (256, dim // heads)  # the buffer 'projection_matrix' (nb_features, dim_heads)
    assert "projection" in dict(m.named_buffers()) and "projection" not in dict(m.named_parameters())


def test_options_and_capabilities():
    with pytest.raises(ValueError, match="feature_map"):
        make(feature_map="exp")
    with pytest.raises(ValueError, match="padded_keys"):
        make(padded_keys="masked")
    with pytest.raises(TypeError, match="rp_dim"):
        make(rp_dim=4)
    caps = attention_spec("performer").capabilities
    assert caps.causal and caps.cross and caps.padding_mask and caps.variable_length


def test_forward_backward_finite():
    m = make(redraw_interval=1).float().train()
    x, mask = (t.float() if t.is_floating_point() else t for t in padded_batch(70, left_padding=True))
    x.requires_grad_(True)
    for causal in (False, True):
        m(x, mask, causal=causal)[mask].pow(2).sum().backward()
    assert torch.isfinite(x.grad).all()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in m.parameters())


def test_counted_on_fake_tensors_as_on_real_ones():
    """The stabiliser is found and used on the device (no value read on the host), so the profiler's
    meta counting runs it: the same FLOPs as on real tensors."""
    from bench_cli.engine.counting import flops_forward, flops_train_step

    m = make().float()
    inputs = {"x": torch.randn(2, 70, D_MODEL, dtype=torch.float32), "mask": padded_batch(70)[1]}
    for count in (flops_forward, lambda *a, **k: flops_train_step(*a[:2], lambda o: o.sum(), **k)):
        assert count(m, inputs, meta=True) == count(m, inputs, meta=False) > 0
