"""`attnbench bench --against-reference`: every baseline is timed against its reference code on the
same weights (a vectorised transcription, or transformers' module for Reformer and Longformer when
installed), the outputs agree in float32, and the table says what it measured (ratio spread,
geometric mean, load). Tiny sizes: a test of the command, not of the speed."""
from __future__ import annotations

import pytest

from bench_cli.commands import bench_reference
from bench_cli.commands.bench_attention import main
from bench_cli.commands.bench_reference import PACKAGE_REFERENCES, VARIANTS, geometric_mean
from bench_cli.core.errors import UserError

# Every test of this file in one xdist worker (`make test` runs --dist loadgroup): importing
# transformers (and torchvision, which it imports) costs about 3 s of CPU, paid once instead of by
# both workers.
pytestmark = pytest.mark.xdist_group("transformers")

TINY = ["--against-reference", "--seq-lens", "128", "--d-model", "16", "--heads", "2", "--repeats", "2",
        "--budget", "0"]


# First in the file, so first in its xdist group: importing transformers and its Reformer module (8 s)
# is paid here, not inside the timed command's test.
@pytest.mark.parametrize("name", PACKAGE_REFERENCES)
def test_transformers_module_on_copied_weights_gives_our_outputs(name):
    """transformers' LSHSelfAttention / LongformerSelfAttention, built and tied as the LRA wrappers do,
    give our outputs and gradients on a right-padded batch (Reformer: the same global RNG state,
    from which both draw the random rotations; another state gives other buckets, so the seeding is
    what makes them agree)."""
    pytest.importorskip("transformers")
    import torch

    from attnbench.models.attention import build_attention

    n = 256  # four LSH chunks, two Longformer windows
    torch.manual_seed(0)
    module = build_attention(name, d_model=16, n_heads=2, **bench_reference.layer_options(name, n)).train()
    reference = bench_reference.reference_forward(name, module, n)
    x, mask = bench_reference.listops_batch(2, n, 16)

    def output_and_grad(forward, seed):
        """The real rows of the output; the gradients of the input and of the (tied) weights."""
        xg = x.clone().requires_grad_()
        out = bench_reference.seeded(lambda: forward(xg, mask), seed)
        (out[mask] ** 2).sum().backward()
        grads = [xg.grad[mask]] + [p.grad for p in module.parameters() if p.grad is not None]
        module.zero_grad(set_to_none=True)
        return out[mask].detach(), grads

    ours, ours_grads = output_and_grad(module, 3)
    theirs, theirs_grads = output_and_grad(reference, 3)
    torch.testing.assert_close(theirs, ours, rtol=1e-4, atol=1e-5)
    assert len(theirs_grads) == len(ours_grads) == (5 if name == "reformer" else 9)  # x; W_q, W_v, W_o (W_k), biases
    for their_grad, our_grad in zip(theirs_grads, ours_grads):
        torch.testing.assert_close(their_grad, our_grad, rtol=1e-4, atol=1e-5)
    if name == "reformer":
        assert not torch.allclose(output_and_grad(reference, 4)[0], ours, rtol=1e-4, atol=1e-5)


def test_times_each_baseline_against_its_reference(capsys):
    packaged = bench_reference.import_transformers() is not None
    results = main(TINY)
    out = " ".join(capsys.readouterr().out.split())  # the table wraps at the terminal's width
    assert {r["variant"] for r in results} == set(VARIANTS) - (set() if packaged else set(PACKAGE_REFERENCES))
    for r in results:
        assert r["n"] == 128 and r["ours_s"] > 0 and r["reference_s"] > 0
        assert r["q1"] <= r["ratio"] <= r["q3"]
        assert r["max_difference"] < 1e-3, r
        assert r["pairs"] == 2 and r["ours_tokens_per_s"] > 0 and "timing_noisy" in r  # the same outputs, float32 rounding apart
    assert "geometric mean of the ratios" in out and "load average" in out and "1 thread" in out
    assert ("n/a: reformer, longformer:" in out) is not packaged and "outputs differ" not in out


def test_variants_subset_and_refusals(capsys, monkeypatch):
    monkeypatch.setattr(bench_reference, "import_transformers", lambda: None)  # as where it is not installed
    results = main([*TINY, "--variants", "soft", "reformer"])
    assert [r["variant"] for r in results] == ["soft"]
    out = " ".join(capsys.readouterr().out.split())
    assert "n/a: reformer: timed against transformers' modules, not installed here (pip install 'attnbench[bench]')" in out
    with pytest.raises(UserError, match="no reference transcription for softmax"):
        main([*TINY, "--variants", "softmax"])
    with pytest.raises(UserError, match="drop --causal"):
        main([*TINY, "--causal"])
    with pytest.raises(UserError, match="--repeats of `attnbench bench` must be an integer of at least 1"):
        main([*TINY, "--repeats", "0"])


def test_a_length_the_reference_cannot_take_is_a_note(capsys):
    results = main([*TINY[:2], "100", *TINY[3:], "--variants", "nystromformer", "cosformer"])
    assert [r["variant"] for r in results] == ["cosformer"]
    assert "n/a: nystromformer at N=100: shape" in " ".join(capsys.readouterr().out.split())


def test_spread_and_mean_helpers():
    assert geometric_mean([0.5, 2.0]) == pytest.approx(1.0)


def test_a_length_transformers_cannot_take_is_refused():
    pytest.importorskip("transformers")
    from attnbench.models.attention import build_attention

    for name, n, what in (("reformer", 100, "chunk length 64"), ("longformer", 200, "window 128")):
        module = build_attention(name, d_model=16, n_heads=2, **bench_reference.layer_options(name, n))
        with pytest.raises(ValueError, match=what):
            bench_reference.reference_forward(name, module, n)
