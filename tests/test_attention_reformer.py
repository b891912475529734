"""Reformer LSH attention (models/attention/reformer.py) against a loop-based float64 transcription of
what mlpen/Nystromformer ``LRA/code/attention_reformer.py`` computes: transformers 3.3.1
``LSHSelfAttention`` (modeling_reformer.py) with query_key = W_q's weight, value = W_v's weight,
then the LRA Attention's ``ff``. The random rotations come from the same seeded draw
(``torch.manual_seed(hash_seed); torch.randn(heads, d, rounds, buckets / 2)``) in both."""
from __future__ import annotations

import pytest
import torch

from attnbench.models.attention import attention_spec, build_attention
from attnbench.models.attention.reference.reformer import code_num_buckets, code_lsh

pytestmark = pytest.mark.usefixtures("float64_single_thread")
D_MODEL, HEADS = 8, 2


def make(**options):
    torch.manual_seed(0)
    return build_attention("reformer", d_model=D_MODEL, n_heads=HEADS, **options).eval()


def batch(n, padded, seed=1):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2, n, D_MODEL, generator=g)
    mask = None
    if padded:
        mask = torch.ones(2, n, dtype=torch.bool)
        mask[0, n - 3:] = False  # right padding
        mask[1, [1, 4]] = False  # holes
    return x, mask


# --------------------------------------------------------------------------- tests

CASES = [  # (length, chunk_length, num_hashes, num_buckets)
    (7, 8, 2, None),  # one chunk: shared-QK attention over all tokens
    (32, 8, 2, None),  # 8 buckets chosen from the length
    (30, 8, 2, None),  # padded to 32 with masked tokens
    (24, 8, 1, 4),  # one round, fixed buckets
    (64, 4, 2, None),  # 32 buckets > limit 8: factorised as [4, 8]
    (20, 4, 3, [2, 4]),  # explicit factorised hash, three rounds
]


@pytest.mark.parametrize("n,chunk,rounds,buckets", CASES)
@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("causal", [False, True])
def test_matches_the_reference_transcription(n, chunk, rounds, buckets, padded, causal):
    m = make(num_hashes=rounds, chunk_length=chunk, num_buckets=buckets, hash_seed=11, chunks_before=1)
    x, mask = batch(n, padded)
    out = m(x, mask, causal=causal)
    expected = code_lsh(m, x, mask, causal, seed=11, num_buckets=buckets)
    rows = torch.ones(2, n, dtype=torch.bool) if mask is None else mask
    torch.testing.assert_close(out[rows], expected[rows])


def test_chunks_after_and_max_len_bound_on_buckets():
    m = make(num_hashes=2, chunk_length=4, chunks_before=0, chunks_after=1, hash_seed=3, max_len=1024)
    x, mask = batch(64, True)
    # max_len 1024: limit 2 * max(16, 4) = 32 >= 32 buckets, so no factorisation
    assert code_num_buckets(64, 4, 1024) == 32
    torch.testing.assert_close(m(x, mask)[mask], code_lsh(m, x, mask, False, seed=3, max_pos=1024)[mask])


def test_rotations_redrawn_from_the_global_rng_without_a_seed():
    """hash_seed None (ReformerConfig default): fresh rotations from torch's global RNG per call."""
    m = make(chunk_length=4)
    x, mask = batch(16, True)
    torch.manual_seed(5)
    first = m(x, mask)
    second = m(x, mask)
    assert not torch.allclose(first, second)  # redrawn
    torch.manual_seed(5)
    torch.testing.assert_close(m(x, mask), first)
    torch.testing.assert_close(first[mask], code_lsh(m, x, mask, False, seed=5)[mask])


def test_hash_seed_fixes_rotations_without_touching_the_global_rng():
    m = make(chunk_length=4, hash_seed=9)
    x, mask = batch(16, True)
    state = torch.get_rng_state()
    first = m(x, mask)
    assert torch.equal(torch.get_rng_state(), state)
    torch.testing.assert_close(m(x, mask), first)
    # the reference reseeds the global RNG instead; same rotations either way
    torch.testing.assert_close(first[mask], code_lsh(m, x, mask, False, seed=9)[mask])


@pytest.mark.parametrize("padded", [False, True])
def test_causal_within_one_chunk_is_strict(padded):
    m = make(chunk_length=16)
    x, mask = batch(12, padded)
    base = m(x, mask, causal=True)
    for t in (1, 5, 11):
        y = x.clone()
        y[:, t:] = 10 * torch.randn(2, 12 - t, D_MODEL)
        torch.testing.assert_close(m(y, mask, causal=True)[:, :t], base[:, :t])


def test_causal_chunked_attention_never_weights_later_tokens():
    """Scaling later tokens by c > 0 keeps every hash bucket (h(cx) = h(x) without a bias), so the
    chunks are unchanged and only the causal mask stands between them and earlier outputs. (Other
    changes of later tokens may move earlier ones between chunks: see the module docstring.)"""
    m = make(chunk_length=4, hash_seed=2)
    x, mask = batch(24, True)
    base = m(x, mask, causal=True)
    for t in (3, 10, 17):
        y = x.clone()
        y[:, t:] *= 7.0
        out = m(y, mask, causal=True)
        torch.testing.assert_close(out[:, :t], base[:, :t])
        assert not torch.allclose(out[:, t:], base[:, t:])
    # the first token has no other key: it attends to itself (its own value)
    own = x[:, 0] @ m.v_proj.weight.T @ m.out_proj.weight.T + m.out_proj.bias
    torch.testing.assert_close(base[:, 0], own)


@pytest.mark.parametrize("n,causal", [(12, False), (30, False), (30, True)])
def test_padded_positions_do_not_reach_real_outputs(n, causal):
    m = make(chunk_length=4 if n > 12 else 16, hash_seed=4)
    x, mask = batch(n, True)
    base = m(x, mask, causal=causal)
    noisy = torch.where(mask[..., None], x, 50 * torch.randn_like(x))
    torch.testing.assert_close(m(noisy, mask, causal=causal)[mask], base[mask])


def test_parameter_counts_equal_the_reference():
    """mlpen LRA Attention: W_q, W_k, W_v, ff = nn.Linear(dim, heads * head_dim) x 3 +
    nn.Linear(heads * head_dim, dim), all with bias. LSHSelfAttention's own query_key / value
    weights are replaced by W_q's / W_v's, so it adds none; W_k and the biases of W_q, W_v are
    counted although LSH attention never uses them."""

    def reference_count(dim, heads, head_dim):
        inner = heads * head_dim
        return 3 * (dim * inner + inner) + (inner * dim + dim)

    lra = build_attention("reformer", d_model=64, n_heads=2, max_len=2000)  # lra_config: 64 / 2 heads of 32
    assert sum(p.numel() for p in lra.parameters()) == reference_count(64, 2, 32) == 16_640
    uea = build_attention("reformer", d_model=64, n_heads=8, max_len=29)  # JapaneseVowels size
    assert sum(p.numel() for p in uea.parameters()) == reference_count(64, 8, 8)


def test_forward_backward_smoke_and_unused_reference_parameters():
    m = make(chunk_length=4).train()
    x, mask = batch(18, True)
    x.requires_grad_(True)
    m(x, mask)[mask].pow(2).sum().backward()
    assert torch.isfinite(x.grad).all()
    no_grad = {name for name, p in m.named_parameters() if p.grad is None}
    assert no_grad == {"k_proj.weight", "k_proj.bias", "q_proj.bias", "v_proj.bias"}
    assert all(torch.isfinite(p.grad).all() for p in m.parameters() if p.grad is not None)


def test_registry_entry_options_and_refusals():
    spec = attention_spec("reformer")
    caps = spec.capabilities
    assert caps.causal and caps.padding_mask and caps.variable_length and caps.sized_by_max_len and not caps.cross
    m = make()
    assert (m.num_hashes, m.chunk_length, m.num_buckets, m.chunks_before, m.chunks_after, m.hash_seed, m.dropout) == (
        2, 64, None, 1, 0, None, 0.0)
    with pytest.raises(TypeError, match="window_size"):
        make(window_size=4)
    with pytest.raises(ValueError, match="even"):
        make(num_buckets=3)
    x, mask = batch(6, True)
    with pytest.raises(ValueError, match="cannot attend to a context"):
        m(x, mask, context=x)
