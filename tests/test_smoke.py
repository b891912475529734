"""`attnbench smoke` (issue 37): the GPU smoke check's plan, its runner and its refusal without CUDA.
The checks themselves need a GPU; here the plan is built for two pretend devices and one
synthetic-input check runs on the CPU."""
from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from bench_cli.commands import smoke as S
from tests.conftest import attnbench


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_without_cuda_one_line_exit_2(workdir):
    r = attnbench("smoke")
    assert r.returncode == 2, r.stdout + r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "no CUDA device is visible" in lines[0], r.stderr
    assert not (workdir / "results").exists()  # nothing ran, nothing written


def test_plan_covers_every_family_in_both_precisions_and_ddp_with_two_gpus(monkeypatch, tmp_path):
    monkeypatch.setattr(S, "half_precision", lambda device: "bf16")
    checks = S.plan(["cuda:0", "cuda:1"], tmp_path, present=lambda family: False)
    names = [c.name for c in checks]
    assert len(names) == len(set(names))
    for device in ("cuda:0", "cuda:1"):
        for family in S.FAMILIES:
            for precision in ("32", "bf16"):
                (check,) = [c for c in checks if c.name.startswith(f"{family.task} {precision} {device}")]
                assert f"trainer.precision={precision}" in check.argv and f"trainer.device={device}" in check.argv
                # every record goes to the smoke's own CSV, never results/runs.csv
                assert family.synthetic or f"results.path={tmp_path / 'records.csv'}" in check.argv
        assert f"primal KSVD bf16 {device}" in names and f"profile timing {device}" in names
    (ddp,) = [c for c in checks if c.name.startswith("ddp")]
    assert "torch.distributed.run" in ddp.launcher and "trainer.strategy=ddp" in ddp.argv
    assert not [c for c in S.plan(["cuda:0"], tmp_path) if c.name.startswith("ddp")]  # one GPU: no DDP check


def test_a_family_with_its_data_present_trains_on_it(monkeypatch, tmp_path):
    monkeypatch.setattr(S, "half_precision", lambda device: "fp16")
    family = next(f for f in S.FAMILIES if f.task == "lra_retrieval")
    real, synthetic = (S.plan(["cuda:0"], tmp_path, (family,), present=lambda f: p)[0] for p in (True, False))
    assert real.argv[0] == "run" and not real.launcher
    assert synthetic.argv[0] == "synthetic" and synthetic.launcher == S.SYNTHETIC


def test_synthetic_steps_train_in_bf16_on_the_cpu():
    overrides = ["task=lra_retrieval", "trainer.device=cpu", "trainer.precision=bf16"]
    loss = S.synthetic_steps(overrides, steps=2, seq_len=64)
    assert math.isfinite(loss)


@pytest.mark.slow
def test_a_failing_check_is_a_line_with_its_reason(tmp_path):
    status, seconds, reason = S.run_check(S.Check("bad", ("run", "task=nope")), set(), timeout=120)
    assert status == "failed" and "unknown task 'nope'" in reason and reason.startswith("exit 2:")
    rows = [{"check": "bad", "status": status, "seconds": f"{seconds:.1f}", "reason": reason}]
    S.write_checks(tmp_path / "checks.csv", rows)
    assert Path(tmp_path / "checks.csv").read_text().splitlines()[0] == "check,status,seconds,reason"


def test_ksvd_energy_is_float32_under_half_precision():
    """Half-precision e/r-scores (autocast's einsum output) enter the KSVD term in float32: e * e in
    fp16 overflows above 256 and the auxiliary loss would be inf."""
    from models.attention import build_attention

    m = build_attention("primal", d_model=16, n_heads=2, low_rank=5, rank_multi=4)
    e = torch.full((1, 2, 3, 5), 300.0, dtype=torch.float16)
    m._record_ksvd(e, e.clone(), torch.zeros(1, 2), None)
    j = m.ksvd_objective
    assert j.dtype == torch.float32 and torch.isfinite(j).all() and torch.isfinite(m.auxiliary_loss())
