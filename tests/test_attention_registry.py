"""Properties every registered attention must have: builds, shapes, gradients, causality, masking, options."""
from __future__ import annotations

import pytest
import torch

from attnbench.models.attention import attention_spec, available_attentions, build_attention, collect_auxiliary_loss

EXPECTED = {
    "softmax", "attention_bn", "attention_sh", "attention_bn_sh",
    "linear", "linear_bn", "linear_sh", "linear_bn_sh",
    "sparse", "sparse_bn", "sparse_sh", "sparse_bn_sh",
    "conv1d", "conv2d", "standard", "optimised", "efficient", "super", "primal",
    # the baselines of the Primal-Attention tables
    "linformer", "nystromformer", "performer", "reformer", "longformer", "yoso_e", "cosformer", "soft", "flowformer",
}
CAUSAL = sorted(n for n in EXPECTED if attention_spec(n).capabilities.causal)
# Variants whose reference code lets the NUMBER of padded positions (not their content) change the
# real positions' outputs: Nystromformer's landmarks are segment means over the padded length and its
# pseudo-inverse starts from a batch-wide maximum; SOFT pools landmarks over the padded length;
# cosFormer's re-weighting cos(pi/2 (i - j) / M) takes M, the padded length.
PADDED_LENGTH_MATTERS = {"nystromformer", "soft", "cosformer"}
# Parameters the reference creates and never uses (kept so parameter counts equal the reference's):
# Reformer's query_key/value are W_q/W_v without biases and W_k is unused (mlpen attention_reformer.py).
UNUSED_PARAMETERS = {"reformer": {"k_proj.weight", "k_proj.bias", "q_proj.bias", "v_proj.bias"}}
LENGTH = 9  # odd, and a square (3 x 3) for conv2d


pytestmark = pytest.mark.usefixtures("single_thread")


def make(name, **extra):
    sized = {"max_len": LENGTH}  # variants sized by the sequence length (W^A of Super, E of Linformer, SOFT's window)
    opts = {"super": sized, "linformer": sized, "soft": sized, "sparse": {"block_size": 2}}.get(name.split("_")[0], {})
    torch.manual_seed(0)
    return build_attention(name, d_model=8, n_heads=2, **{**opts, **extra}).eval()


def causal_options(name):
    return {"data_dependent": False} if name == "primal" else {}


def test_registry_lists_every_variant_with_metadata():
    assert set(available_attentions()) == EXPECTED
    for name in EXPECTED:
        spec = attention_spec(name)
        assert spec.paper and spec.equation and spec.summary, name
    assert attention_spec("primal").capabilities.extra_loss
    assert not attention_spec("super").capabilities.variable_length
    assert not attention_spec("conv2d").capabilities.causal
    assert not attention_spec("linear_bn").capabilities.causal


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_forward_backward_finite(name):
    m = make(name).train()
    x = torch.randn(2, LENGTH, 8, requires_grad=True)
    mask = torch.ones(2, LENGTH, dtype=torch.bool)
    mask[1, 5:] = False
    y = m(x, mask)
    assert y.shape == x.shape
    loss = y[mask].pow(2).sum()
    auxiliary = collect_auxiliary_loss(m)  # Primal's Lambda only enters through the KSVD term
    assert (auxiliary is not None) == attention_spec(name).capabilities.extra_loss
    (loss if auxiliary is None else loss + auxiliary).backward()
    assert torch.isfinite(x.grad).all()
    for pname, p in m.named_parameters():
        if pname in UNUSED_PARAMETERS.get(name, ()):
            assert p.grad is None, f"{pname} is listed as unused but gets a gradient"
            continue
        assert p.grad is not None and torch.isfinite(p.grad).all(), pname


@pytest.mark.parametrize("name", CAUSAL)
@pytest.mark.parametrize("padded", [False, True])
def test_causal_later_tokens_do_not_change_earlier_outputs(name, padded):
    m = make(name, **causal_options(name))
    x = torch.randn(2, LENGTH, 8)
    mask = None
    if padded:
        mask = torch.ones(2, LENGTH, dtype=torch.bool)
        mask[0, :2] = False  # left padding: early queries may see nothing
        mask[1, 7:] = False
    base = m(x, mask, causal=True)
    for t in (3, 6, LENGTH - 1):
        y = x.clone()
        y[:, t:] = torch.randn(2, LENGTH - t, 8)
        out = m(y, mask, causal=True)
        assert torch.isfinite(out).all()
        torch.testing.assert_close(out[:, :t], base[:, :t], msg=f"{name}: token {t} leaked backwards")


@pytest.mark.parametrize("name", sorted(n for n in EXPECTED if not attention_spec(n).capabilities.causal))
def test_non_causal_variants_refuse_causal(name):
    with pytest.raises(ValueError, match="causal"):
        make(name)(torch.randn(1, LENGTH, 8), causal=True)


@pytest.mark.parametrize("name, causal", [(n, False) for n in sorted(EXPECTED)] + [(n, True) for n in CAUSAL])
def test_masked_positions_do_not_change_unmasked_outputs(name, causal):
    m = make(name, **(causal_options(name) if causal else {}))
    x = torch.randn(2, LENGTH, 8)
    mask = torch.ones(2, LENGTH, dtype=torch.bool)
    mask[0, [1, 4]] = False
    mask[1, 6:] = False
    base = m(x, mask, causal=causal)
    y = torch.where(mask[..., None], x, 50 * torch.randn(2, LENGTH, 8))
    torch.testing.assert_close(m(y, mask, causal=causal)[mask], base[mask])


def test_right_padding_equals_the_unpadded_sequence():
    """For variable-length variants a right-padded batch row gives the unpadded result."""
    for name in sorted(EXPECTED - {"super", "conv2d", "linformer"} - PADDED_LENGTH_MATTERS):  # fixed lengths
        # Performer as the LRA code: zeroed padded keys still count in the denominator
        m = make(name, **({"padded_keys": "excluded"} if name == "performer" else {}))
        x = torch.randn(1, 7, 8)
        padded = torch.cat([x, torch.randn(1, 4, 8)], 1)
        mask = torch.arange(11)[None] < 7
        torch.testing.assert_close(m(padded, mask)[:, :7], m(x), msg=name)


def test_unknown_and_misplaced_options_raise_type_error_naming_them():
    with pytest.raises(TypeError, match="frobnicate"):
        build_attention("attention_bn", d_model=8, n_heads=2, frobnicate=1)
    with pytest.raises(TypeError, match="beta"):
        build_attention("attention_sh", d_model=8, n_heads=2, beta=0.5)
    with pytest.raises(TypeError, match="sh_factors"):
        build_attention("linear_bn", d_model=8, n_heads=2, sh_factors=[1, 2])
    with pytest.raises(TypeError, match="block_size"):
        build_attention("linear", d_model=8, n_heads=2, block_size=4)
    with pytest.raises(TypeError, match="low_rank"):
        build_attention("softmax", d_model=8, n_heads=2, low_rank=4)
    for name in ("conv1d", "optimised", "primal"):
        with pytest.raises(TypeError, match="beta"):
            build_attention(name, d_model=8, n_heads=2, beta=1.0)


def test_sh_factors_length_must_match_heads():
    with pytest.raises(ValueError, match="sh_factors"):
        build_attention("attention_sh", d_model=8, n_heads=2, sh_factors=[1, 2, 4])
    with pytest.raises(ValueError, match="positive"):
        build_attention("sparse_bn_sh", d_model=8, n_heads=2, sh_factors=[0, 2])
    m = build_attention("attention_bn_sh", d_model=16, n_heads=4)
    assert m.sh_factors == [1, 1, 2, 4]  # the ImageNet setting (J.3) is the 4-head default


def test_common_options_accepted_everywhere():
    for name in EXPECTED:
        extra = {"max_len": 4} if name in ("super", "linformer", "soft") else {}
        m = build_attention(name, d_model=8, n_heads=2, dropout=0.1, bias=False, **extra)
        # bias=False is about the projections: W^A's bias (Super) and SOFT's LayerNorm keep theirs
        assert all(not n.endswith("bias") or n.startswith(("align", "landmark_norm")) for n, _ in m.named_parameters()), name


def test_speed_benchmark_runs_every_variant(capsys):
    from bench_cli.commands.bench_attention import main

    results = main(["--seq-lens", "16", "--d-model", "8", "--heads", "2", "--repeats", "3", "--budget", "0"])
    timed = {r["variant"] for r in results}
    assert timed == EXPECTED  # 16 is a 4 x 4 grid, so conv2d runs too
    assert all(r["forward_s"] > 0 and r["fwd_bwd_s"] > 0 for r in results)
    assert all(r["forward_ratio_q1"] <= r["forward_ratio"] <= r["forward_ratio_q3"] for r in results)
    assert all(r["fwd_bwd_tokens_per_s"] > 0 and "load_before" in r and "timing_noisy" in r for r in results)
    out = capsys.readouterr().out
    assert "x softmax" in out and "load average" in out
    from bench_cli.core.errors import UserError

    with pytest.raises(UserError, match="unknown variant 'nope'"):  # the CLI's one line, exit 2 (test_faults)
        main(["--variants", "nope"])


def test_speed_benchmark_says_why_a_variant_is_not_timed(capsys):
    from bench_cli.commands.bench_attention import main

    args = ["--seq-lens", "15", "--d-model", "8", "--heads", "2", "--repeats", "1", "--budget", "0", "--variants",
            "conv2d", "linear"]
    results = main([*args, "--causal"])
    assert {r["variant"] for r in results} == {"softmax", "linear"}
    out = capsys.readouterr().out
    assert "n/a: conv2d: not causal" in out
    main(args)  # bidirectional: conv2d is skipped for the length, not for causality
    assert "n/a: conv2d: needs a square N (a patch grid), N=15" in capsys.readouterr().out
    main(["--seq-lens", "16", "--d-model", "8", "--heads", "2", "--repeats", "1", "--budget", "0", "--variants", "primal",
          "--causal"])
    assert "primal: causal with data_dependent=false" in capsys.readouterr().out
