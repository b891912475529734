"""`attnbench bench --against-reference`: every baseline with a vectorised reference transcription is
timed against it on the same weights, the outputs agree in float32, and the table says what it
measured (ratio spread, geometric mean, load). Tiny sizes: a test of the command, not of the speed."""
from __future__ import annotations

import pytest

from bench_cli.bench_attention import main
from bench_cli.bench_reference import LOOP_TRANSCRIPTIONS, VARIANTS, geometric_mean, quartiles
from bench_cli.core.errors import UserError

TINY = ["--against-reference", "--seq-lens", "128", "--d-model", "16", "--heads", "2", "--repeats", "2"]


def test_times_each_baseline_against_its_reference(capsys):
    results = main(TINY)
    out = " ".join(capsys.readouterr().out.split())  # the table wraps at the terminal's width
    assert {r["variant"] for r in results} == set(VARIANTS) - set(LOOP_TRANSCRIPTIONS)
    for r in results:
        assert r["n"] == 128 and r["ours_s"] > 0 and r["reference_s"] > 0
        assert r["q1"] <= r["ratio"] <= r["q3"]
        assert r["max_difference"] < 1e-3, r  # the same outputs, float32 rounding apart
    assert "geometric mean of the ratios" in out and "load average" in out and "1 thread" in out
    assert "n/a: reformer, longformer:" in out and "outputs differ" not in out


def test_variants_subset_and_refusals(capsys):
    results = main([*TINY, "--variants", "soft", "reformer"])
    assert [r["variant"] for r in results] == ["soft"]
    assert "n/a: reformer:" in " ".join(capsys.readouterr().out.split())
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
    assert quartiles([1.0, 2.0, 3.0, 4.0, 5.0]) == (2.0, 4.0)
    assert quartiles([0.7]) == (0.7, 0.7)
    assert geometric_mean([0.5, 2.0]) == pytest.approx(1.0)
