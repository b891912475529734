"""papers/004: Primal-Attention (Algorithm 1, Listing 1) and its KSVD objective (Eqn. (1))."""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from attnbench.models.attention import build_attention, collect_auxiliary_loss


pytestmark = pytest.mark.usefixtures("float64_single_thread")


def reference_primal(m, x, mask, causal):
    """Algorithm 1 / Listing 1 one sequence and head at a time; returns (output, J (B, H))."""
    b_size, n, d_m = x.shape
    h_count, d, s = m.n_heads, m.d_head, m.low_rank
    out = torch.zeros(b_size, n, d_m)
    objective = torch.zeros(b_size, h_count)
    for b in range(b_size):
        real = [i for i in range(n) if mask is None or mask[b, i]]
        length = len(real)
        for h in range(h_count):
            ch = slice(h * d, (h + 1) * d)
            q = x[b] @ m.q_proj.weight[ch].T + m.q_proj.bias[ch]
            k = x[b] @ m.k_proj.weight[ch].T + m.k_proj.bias[ch]
            if causal:  # Listing 1: running means (over real tokens) before the feature maps
                qm, km = torch.zeros_like(q), torch.zeros_like(k)
                for i in range(n):
                    past = [j for j in real if j <= i] or [i]
                    qm[i], km[i] = q[past].mean(0), k[past].mean(0)
                q, k = qm, km
            phi_q = q / q.norm(dim=-1, keepdim=True)  # cosine feature maps
            phi_k = k / k.norm(dim=-1, keepdim=True)
            if m.data_dependent:
                n_rows = min(s * m.rank_multi, length)
                picks = [real[(r * (length - 1)) // max(n_rows - 1, 1)] for r in range(n_rows)]
                x_sampled = x[b, picks][:, ch]  # X' (n x d), that head's channels
                we_x = x_sampled.T @ m.we[h, :n_rows]  # W_e|X = X'^T W_e
                wr_x = x_sampled.T @ m.wr[h, :n_rows]
                trace = torch.trace(m.we[h, :n_rows].T @ m.wr[h, :n_rows])
            else:
                we_x, wr_x = m.we[h], m.wr[h]
                trace = torch.trace(m.we[h].T @ m.wr[h])
            e = phi_q @ we_x  # e(x_i) = W_e|X^T phi_q(x_i)
            r = phi_k @ wr_x
            out[b, :, ch] = torch.cat([e, r], -1) @ m.concat_proj.weight.T + m.concat_proj.bias
            lam = torch.diag(m.lam[h])
            energy = sum(0.5 * (e[i] @ lam @ e[i] + r[i] @ lam @ r[i]) for i in real) / length
            objective[b, h] = energy - trace  # Eqn. (1), position sums averaged
    return out @ m.out_proj.weight.T + m.out_proj.bias, objective


CASES = [
    # (data_dependent, low_rank, rank_multi, length): n = min(s*rank_multi, N) both below and above N
    (True, 3, 2, 11),
    (True, 2, 3, 5),
    (True, 4, 1, 11),
    (False, 3, 2, 11),
]


# causal Primal needs data-independent weights (Listing 1): causal only for those cases
@pytest.mark.parametrize("data_dependent,low_rank,rank_multi,length,causal",
                         [(*c, False) for c in CASES] + [(*c, True) for c in CASES if not c[0]])
@pytest.mark.parametrize("padded", [False, True])
def test_primal_matches_algorithm_1_and_eqn_1(data_dependent, low_rank, rank_multi, length, padded, causal):
    torch.manual_seed(0)
    m = build_attention("primal", d_model=8, n_heads=2, low_rank=low_rank, rank_multi=rank_multi,
                        data_dependent=data_dependent).eval()
    x = torch.randn(2, length, 8)
    mask = None
    if padded:
        mask = torch.ones(2, length, dtype=torch.bool)
        mask[1, length - 2 :] = False
        mask[0, 1] = False
    got = m(x, mask, causal=causal)
    want, objective = reference_primal(m, x, mask, causal)
    rows = slice(None) if mask is None else mask
    torch.testing.assert_close(got[rows], want[rows])
    torch.testing.assert_close(m.ksvd_objective, objective)
    torch.testing.assert_close(m.auxiliary_loss(), (objective**2).mean())


def test_parameters_and_shapes():
    m = build_attention("primal", d_model=16, n_heads=2, low_rank=5, rank_multi=4)
    names = {k.split(".")[0] for k, _ in m.named_parameters()}
    assert names == {"q_proj", "k_proj", "out_proj", "we", "wr", "lam", "concat_proj"}  # no value projection
    assert m.we.shape == m.wr.shape == (2, 20, 5)  # (heads, n_max = s * rank_multi, s)
    assert m.lam.shape == (2, 5) and m.concat_proj.weight.shape == (8, 10)
    independent = build_attention("primal", d_model=16, n_heads=2, low_rank=5, data_dependent=False)
    assert independent.we.shape == (2, 8, 5)  # (heads, d_head, s)
    for h in range(2):  # orthogonal init per head
        torch.testing.assert_close(m.we[h].T @ m.we[h], torch.eye(5))


def test_sampling_is_deterministic_and_masked_rows_do_not_matter():
    torch.manual_seed(0)
    m = build_attention("primal", d_model=8, n_heads=2, low_rank=2, rank_multi=2)
    x = torch.randn(1, 9, 8)
    m.train()
    first = m(x)
    m.eval()
    torch.testing.assert_close(first, m(x))  # same rows at train and test
    mask = torch.ones(1, 12, dtype=torch.bool)
    mask[0, 9:] = False
    padded = torch.cat([x, 100 * torch.randn(1, 3, 8)], 1)
    torch.testing.assert_close(m(padded, mask)[:, :9], first)
    j_short = m.ksvd_objective.clone()
    m(x)
    torch.testing.assert_close(j_short, m.ksvd_objective)


def test_causal_data_dependent_is_refused():
    m = build_attention("primal", d_model=8, n_heads=2)
    with pytest.raises(ValueError, match="data_dependent"):
        m(torch.randn(1, 4, 8), causal=True)


def test_auxiliary_loss_is_in_the_graph_and_collected_over_layers():
    torch.manual_seed(0)
    layers = nn.ModuleList([build_attention("primal", d_model=8, n_heads=2, low_rank=3, rank_multi=2) for _ in range(2)]
                           + [build_attention("softmax", d_model=8, n_heads=2)])
    assert collect_auxiliary_loss(layers) is None  # nothing before a forward pass
    x = torch.randn(2, 6, 8)
    for layer in layers:
        x = layer(x)
    total = collect_auxiliary_loss(layers)
    torch.testing.assert_close(total, layers[0].auxiliary_loss() + layers[1].auxiliary_loss())
    (x.sum() + 0.1 * total).backward()
    assert layers[0].lam.grad is not None and torch.isfinite(layers[0].lam.grad).all()
    assert layers[0].we.grad.abs().sum() > 0
