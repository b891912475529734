"""papers/003 variants (softmax/linear/sparse x BN/SH, Conv1D/2D) against their equations.

The references below are written from the formulas, one query at a time, with the module's
own weights: explicit masked means for pooling (Remark 5), explicit key means (Eqn. 26,
22-23), explicit softmax / elu+1 sums (Eqn. 1, 27), explicit Child et al. membership sets
(Eqn. 16), explicit convolutions (Eqn. 43, 45). float64 throughout.
"""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from attnbench.models.attention import build_attention
from attnbench.models.attention.kernels import linear_attention
from attnbench.models.attention.modifiers import KeySet, masked_average_pool

EPS = 1e-5  # BN epsilon of Eqn. 23


pytestmark = pytest.mark.usefixtures("float64_single_thread")


def inputs(batch=2, length=13, d_model=8, padded=True, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, length, d_model, generator=g)
    mask = None
    if padded:
        mask = torch.ones(batch, length, dtype=torch.bool)
        mask[1, length - 4 :] = False  # right padding
        mask[0, 2] = False  # and a hole
    return x, mask


def head_rows(linear, h, d):
    return linear.weight[h * d : (h + 1) * d], linear.bias[h * d : (h + 1) * d]


# ------------------------------------------------------------------ Child et al. membership (Eqn. 16)


def child_member(p, j, block_len, pattern, c, causal):
    """j in M_i for a query at key-grid position p (Child et al. 2019, as documented)."""
    if pattern == "strided":
        if causal:
            return (p - block_len <= j <= p) or (j <= p and (p - j) % block_len == 0)
        return abs(p - j) <= block_len or (p - j) % block_len == 0
    if causal:
        return j <= p and (j // block_len == p // block_len or j % block_len >= block_len - c)
    return j // block_len == p // block_len or j % block_len >= block_len - c


# ------------------------------------------------------------------ reference of Eqn. 25/26/51 (+27, 16)


def reference_kernel_attention(m, x, mask, causal):
    b_size, n, c_model = x.shape
    h_count, d = m.n_heads, m.d_head
    beta = float(m.beta) if m.bn else 0.0
    out = torch.zeros(b_size, n, c_model)
    for b in range(b_size):
        valid = [True] * n if mask is None else mask[b].tolist()
        for h in range(h_count):
            f = m.sh_factors[h]
            # Remark 5: average-pool the input by f (masked mean; partial last window kept)
            windows = [list(range(j * f, min((j + 1) * f, n))) for j in range(math.ceil(n / f))]
            pooled, key_valid, release = [], [], []
            for w in windows:
                real = [p for p in w if valid[p]]
                pooled.append(x[b, real].mean(0) if real else torch.zeros(c_model))
                key_valid.append(bool(real))
                release.append(max(real) if real else w[-1])  # last (valid) position covered
            xs = torch.stack(pooled)
            wq, bq = head_rows(m.q_proj, h, d)
            wk, bk = head_rows(m.k_proj, h, d)
            wv, bv = head_rows(m.v_proj, h, d)
            q, k, v = x[b] @ wq.T + bq, xs @ wk.T + bk, xs @ wv.T + bv
            for i in range(n):
                seen = [j for j in range(len(xs)) if key_valid[j] and (not causal or release[j] <= i)]
                if m.kernel_name == "sparse":
                    block_len = m.block_size
                    used = [j for j in seen if child_member(i // f, j, block_len, m.sparse_pattern, m.summary_size, causal)]
                else:
                    used = seen
                if not used:
                    continue  # no support vector: zero output
                qi, ku = q[i], k[used]
                if m.bn:  # Eqn. 26 (and 22-23): statistics of the keys this query's regression is fitted on
                    mu = k[seen].mean(0)
                    qi, ku = qi - beta * mu, ku - beta * mu
                    if m.bn_scale:
                        std = torch.sqrt(((k[seen] - mu) ** 2).mean(0) + EPS)
                        qi, ku = qi / std, ku / std
                if m.kernel_name == "linear":  # Eqn. 27, Phi = elu + 1
                    sim = (F.elu(ku) + 1) @ (F.elu(qi) + 1)
                    weights = sim / sim.sum()
                else:  # softmax (Eqn. 1) over the used keys
                    weights = torch.softmax(ku @ qi / math.sqrt(d), 0)
                out[b, i, h * d : (h + 1) * d] = weights @ v[used]
    return out @ m.out_proj.weight.T + m.out_proj.bias


FAMILY = [
    prefix + suffix
    for prefix in ("attention", "linear", "sparse")
    for suffix in ("", "_bn", "_sh", "_bn_sh")
    if prefix + suffix != "attention"
] + ["softmax"]


def family_options(name, pattern="strided"):
    opts = {}
    if "_bn" in name:
        opts["beta"] = 0.7
    if "_sh" in name:
        opts["sh_factors"] = [2, 1, 3, 2]  # non-contiguous groups exercise head reordering
    if name.startswith("sparse"):
        opts.update(block_size=3, sparse_pattern=pattern, summary_size=2)
    return opts


def build_family(name, **extra):
    torch.manual_seed(1)
    m = build_attention(name, d_model=8, n_heads=4, **{**family_options(name), **extra}).double()
    if name == "softmax":  # give the reference the attributes it reads
        m.kernel_name, m.bn, m.sh_factors = "softmax", False, [1] * 4
    return m.eval()


def with_causal(names):
    """(name, causal) pairs: every variant bidirectionally, and causally where it can run so
    (linear BN is not causal: the keys' mean would include later keys)."""
    return [(n, False) for n in names] + [(n, True) for n in names if not n.startswith("linear_bn")]


@pytest.mark.parametrize("name, causal", with_causal(FAMILY))
@pytest.mark.parametrize("padded", [False, True])
def test_family_matches_equation(name, padded, causal):
    m = build_family(name)
    x, mask = inputs(padded=padded)
    got = m(x, mask, causal=causal)
    want = reference_kernel_attention(m, x, mask, causal)
    rows = slice(None) if mask is None else mask  # padded queries are unspecified
    torch.testing.assert_close(got[rows], want[rows], rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize("name, causal", with_causal(["attention_bn", "attention_bn_sh", "sparse_bn", "linear_bn",
                                                      "linear_bn_sh"]))
def test_bn_scale_matches_eqn_22_23(name, causal):
    m = build_family(name, bn_scale=True)
    x, mask = inputs(padded=True, seed=3)
    got = m(x, mask, causal=causal)
    want = reference_kernel_attention(m, x, mask, causal)
    torch.testing.assert_close(got[mask], want[mask], rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize("pattern", ["strided", "fixed"])
@pytest.mark.parametrize("name", ["sparse", "sparse_sh"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("block_size", [1, 2, 4, 5])
def test_sparse_patterns(pattern, name, causal, block_size):
    torch.manual_seed(2)
    opts = {**family_options(name, pattern), "block_size": block_size, "summary_size": min(2, block_size)}
    m = build_attention(name, d_model=8, n_heads=4, **opts).double().eval()
    x, mask = inputs(length=17, padded=True, seed=4)
    got = m(x, mask, causal=causal)
    want = reference_kernel_attention(m, x, mask, causal)
    torch.testing.assert_close(got[mask], want[mask], rtol=1e-9, atol=1e-10)


def test_sparse_default_block_is_sqrt_n():
    for pattern in ("strided", "fixed"):
        m = build_attention("sparse", d_model=8, n_heads=2, sparse_pattern=pattern).double().eval()
        x, _ = inputs(length=16, padded=False)
        got = m(x, causal=True)
        m.block_size, m.summary_size = 4, 1  # l = ceil(sqrt(16)), c = max(1, l // 8)
        torch.testing.assert_close(got, reference_kernel_attention(m, x, None, True))


@pytest.mark.parametrize("kernel", ["attention", "linear", "sparse"])
def test_beta_zero_bn_equals_kernel_and_unit_factors_sh_equal_kernel(kernel):
    base_name = "softmax" if kernel == "attention" else kernel
    sparse = {"block_size": 3} if kernel == "sparse" else {}
    torch.manual_seed(0)
    base = build_attention(base_name, d_model=8, n_heads=4, **sparse).double().eval()
    x, mask = inputs(padded=True)
    for causal in (False, True):
        want = base(x, mask, causal=causal)
        variants = {f"{kernel}_bn": {"beta": 0.0}, f"{kernel}_sh": {"sh_factors": [1, 1, 1, 1]},
                    f"{kernel}_bn_sh": {"beta": 0.0, "sh_factors": [1, 1, 1, 1]}}
        for name, opts in variants.items():
            if causal and name.startswith("linear_bn"):
                continue
            m = build_attention(name, d_model=8, n_heads=4, **opts, **sparse).double().eval()
            m.load_state_dict(base.state_dict())
            torch.testing.assert_close(m(x, mask, causal=causal)[mask], want[mask], msg=name)


def test_learnable_beta_is_a_trained_parameter():
    m = build_attention("attention_bn_sh", d_model=8, n_heads=4, beta=0.5, beta_learnable=True).double()
    assert isinstance(m.beta, torch.nn.Parameter) and m.beta.item() == 0.5
    x, mask = inputs()
    m(x, mask).sum().backward()
    assert m.beta.grad is not None and torch.isfinite(m.beta.grad) and m.beta.grad != 0
    fixed = build_attention("attention_bn", d_model=8, n_heads=4, beta=0.5)
    assert "beta" not in dict(fixed.named_parameters())


def test_masked_average_pool_keeps_partial_window_and_ignores_padding():
    x = torch.arange(7.0)[None, :, None].repeat(2, 1, 1)
    mask = torch.tensor([[True] * 7, [True, False, True, True, False, False, False]])
    pooled, valid, release = masked_average_pool(x, mask, 3)
    assert torch.equal(pooled[0, :, 0], torch.tensor([1.0, 4.0, 6.0]))  # last window = [6] alone
    assert torch.equal(pooled[1, :, 0], torch.tensor([1.0, 3.0, 0.0]))  # (0+2)/2, 3, nothing
    assert valid[1].tolist() == [True, True, False]
    assert release[0].tolist() == [2, 5, 6] and release[1].tolist()[:2] == [2, 3]


def test_sh_causal_pooled_key_seen_only_after_its_window():
    """A pooled key over [j f, (j+1) f) is used by query i only if i >= (j+1) f - 1."""
    m = build_attention("attention_sh", d_model=4, n_heads=1, sh_factors=[3]).double().eval()
    x, _ = inputs(batch=1, length=9, d_model=4, padded=False)
    base = m(x, causal=True)
    assert torch.equal(base[0, :2], m.out_proj.bias.expand(2, 4))  # no complete window yet: zero head output
    for t in range(9):  # token t changes its own query and, from the end of its window on, a key
        y = x.clone()
        y[0, t] += 1.0
        changed = ((m(y, causal=True) - base).abs().amax(-1)[0] > 1e-12).tolist()
        first_seen = (t // 3 + 1) * 3 - 1
        assert all(changed[i] == (i >= first_seen) for i in range(9) if i != t), t


def causal_keys_by_definition(x, mask, factor):
    """SH keys of one sequence set written out (Remark 5 + the causal rule of Sec. 2.3), by loops.

    Window j covers input positions j f .. min((j+1) f, N) - 1 (the last one may be partial). Its
    key is the mean of the window's valid inputs, and it is a key at all only if it has one. Under
    causality query i may use it once every input it averages is in the past: i >= the window's
    last valid position. f = 1 gives the full-resolution keys: key j = x_j, seen from i = j on.
    Returns per sequence a list of (key vector, first query allowed) for the real keys only.
    """
    b_size, n, _ = x.shape
    keys = []
    for b in range(b_size):
        row = []
        for start in range(0, n, factor):
            real = [p for p in range(start, min(start + factor, n)) if mask[b, p]]
            if real:
                row.append((sum(x[b, p] for p in real) / len(real), max(real)))
        keys.append(row)
    return keys


@pytest.mark.parametrize("factor", [1, 2, 3])
@pytest.mark.parametrize("chunk", [1, 2, 5, 64])
def test_causal_linear_chunks_equal_prefix_sums(factor, chunk):
    """Chunked causal linear attention (Eqn. 27, Phi = elu + 1) against the explicit sums over the
    keys each query may see, keys and their release derived from x and the mask by loops."""
    g = torch.Generator().manual_seed(5)
    n, groups = 11, 3
    q = torch.randn(2, groups, n, 4, generator=g)
    x = torch.randn(2, n, 4, generator=g)
    mask = torch.ones(2, n, dtype=torch.bool)
    mask[0, 8:] = False
    mask[1, 4] = False  # a hole: a window with fewer valid inputs (or, at f = 1, a missing key)
    if factor == 1:
        k_in, valid, release = x, mask, None
    else:
        k_in, valid, release = masked_average_pool(x, mask, factor)
    keys = KeySet(k=k_in[:, None].expand(-1, groups, -1, -1) * 0.5, v=k_in[:, None].expand(-1, groups, -1, -1),
                  valid=valid, release=release, factor=factor)
    got = linear_attention(q, keys, causal=True, chunk=chunk)

    def phi(t):
        return F.elu(t) + 1

    want = torch.zeros_like(got)
    for b, row in enumerate(causal_keys_by_definition(x, mask, factor)):
        for g_ in range(groups):
            for i in range(n):
                seen = [key for key, first in row if first <= i]
                if not seen:
                    continue  # nothing released yet: zero output
                sims = [phi(q[b, g_, i]) @ phi(0.5 * key) for key in seen]
                want[b, g_, i] = sum(s * key for s, key in zip(sims, seen)) / sum(sims)
    torch.testing.assert_close(got, want)


# ------------------------------------------------------------------ Conv1D / Conv2D (Eqn. 45, 43)


def reference_conv_attention(m, x, mask, causal, conv):
    """softmax(Conv(Q)(i)^T Conv(K)(j) / sqrt(D)) v_j with an explicit convolution ``conv``."""
    q = x @ m.q_proj.weight.T + m.q_proj.bias
    k = x @ m.k_proj.weight.T + m.k_proj.bias
    v = x @ m.v_proj.weight.T + m.v_proj.bias
    if mask is not None:
        q, k = q * mask[..., None], k * mask[..., None]
    q, k = conv(q), conv(k)
    b_size, n, c = x.shape
    h_count, d = m.n_heads, m.d_head
    out = torch.zeros(b_size, n, c)
    for b in range(b_size):
        for h in range(h_count):
            sl = slice(h * d, (h + 1) * d)
            logits = q[b, :, sl] @ k[b, :, sl].T / math.sqrt(d)
            if mask is not None:
                logits = logits.masked_fill(~mask[b][None, :], -math.inf)
            if causal:
                logits = logits.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), -math.inf)
            out[b, :, sl] = torch.softmax(logits, -1) @ v[b, :, sl]
    return out @ m.out_proj.weight.T + m.out_proj.bias


@pytest.mark.parametrize("kernel_size", [1, 2, 5])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("padded", [False, True])
def test_conv1d_matches_eqn_45(kernel_size, causal, padded):
    torch.manual_seed(0)
    m = build_attention("conv1d", d_model=8, n_heads=2, kernel_size=kernel_size).double().eval()
    w = m.conv.weight.view(-1)
    left = kernel_size - 1 if causal else (kernel_size - 1) // 2

    def conv(t):  # out[i] = sum_s w[s] t[i + s - left], zero outside the sequence, same kernel every channel
        out = torch.zeros_like(t)
        for i in range(t.shape[1]):
            for s in range(kernel_size):
                src = i + s - left
                if 0 <= src < t.shape[1]:
                    out[:, i] += w[s] * t[:, src]
        return out

    x, mask = inputs(padded=padded)
    got = m(x, mask, causal=causal)
    want = reference_conv_attention(m, x, mask, causal, conv)
    rows = slice(None) if mask is None else mask
    torch.testing.assert_close(got[rows], want[rows])


@pytest.mark.parametrize("kernel_size", [(2, 2), (3, 3), (1, 2)])
@pytest.mark.parametrize("grid,length", [((3, 4), 12), ((3, 4), 13), (None, 16), (None, 10)])
def test_conv2d_matches_eqn_43(kernel_size, grid, length):
    torch.manual_seed(0)
    opts = {"grid": grid} if grid else {}
    m = build_attention("conv2d", d_model=8, n_heads=2, kernel_size=kernel_size, **opts).double().eval()
    rows, cols = grid or (int(math.isqrt(length)),) * 2
    has_cls = length == rows * cols + 1
    kh, kw = kernel_size
    w = m.conv.weight.view(kh, kw)
    top, left = (kh - 1) // 2, (kw - 1) // 2

    def conv(t):
        out = t.clone()  # the cls token stays unconvolved
        start = 1 if has_cls else 0
        for r in range(rows):
            for c in range(cols):
                acc = torch.zeros_like(t[:, 0])
                for a in range(kh):
                    for bb in range(kw):
                        rr, cc = r + a - top, c + bb - left
                        if 0 <= rr < rows and 0 <= cc < cols:
                            acc += w[a, bb] * t[:, start + rr * cols + cc]
                out[:, start + r * cols + c] = acc
        return out

    x, _ = inputs(length=length, padded=False)
    torch.testing.assert_close(m(x), reference_conv_attention(m, x, None, False, conv))


def test_conv2d_rejects_non_grid_lengths_and_causal():
    m = build_attention("conv2d", d_model=8, n_heads=2)
    with pytest.raises(ValueError, match="grid"):
        m(torch.randn(1, 11, 8))
    with pytest.raises(ValueError, match="causal"):
        m(torch.randn(1, 16, 8), causal=True)


def test_conv_kernel_is_shared_by_every_channel_and_by_queries_and_keys():
    m = build_attention("conv1d", d_model=8, n_heads=2, kernel_size=5)
    assert m.conv.weight.numel() == 5
    m2 = build_attention("conv2d", d_model=8, n_heads=2)
    assert m2.conv.weight.numel() == 4


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("factor", [1, 3])
def test_softmax_query_folding_for_cpu_backward_is_exact(monkeypatch, causal, factor):
    """Folding query chunks into the batch (CPU backward parallelism) must not change results."""
    from attnbench.models.attention import kernels

    monkeypatch.setattr(kernels, "MIN_QUERIES_PER_SPLIT", 2)
    x, mask = inputs(batch=2, length=11, d_model=4)
    keys_in, valid, release = (x, mask, None) if factor == 1 else masked_average_pool(x, mask, factor)
    keys = KeySet(k=keys_in[:, None] * 0.7, v=keys_in[:, None], valid=valid, release=release, factor=factor)
    q = torch.randn(2, 1, 11, 4, requires_grad=True)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(4)
        assert kernels._query_split(q, keys) == 2  # 4 threads / (2 batch x 1 head)
        folded = kernels.softmax_attention(q, keys, causal)
    finally:
        torch.set_num_threads(threads)
    with torch.no_grad():
        direct = kernels.softmax_attention(q, keys, causal)
    torch.testing.assert_close(folded, direct)
