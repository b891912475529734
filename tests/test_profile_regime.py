"""`attnbench profile` in the papers' regime and today's: trainer.precision honoured and recorded,
the Transformer's attention under gradient checkpointing (Primal-Attention's lra_config.py), and
softmax through torch's fused scaled_dot_product_attention beside the paper's baseline."""
from __future__ import annotations

import csv

import pytest

from bench_cli.commands.cli import main
from bench_cli.commands.profile import grid

# A tiny UEA model (synthetic shapes; no data read). One layer: every side's peak is tracked op by op on
# fake tensors, whose cost is per op, not per byte (checkpointing is checked on the Table 4 preset's encoder);
# N = 128 so that the activations outweigh autocast's bf16 copies of the weights (bf16 then peaks lower).
TINY = ["task.backbone.d_model=16", "task.backbone.n_heads=2", "task.backbone.n_layers=1", "task.backbone.d_ff=32",
        "task.backbone.dropout=0.0", "trainer.progress=false", "profile.timing.warmup=1", "profile.timing.repeats=1",
        "profile.timing.budget_s=0", "profile.plot=null", "profile.flops=off", "profile.seq_lens=[128]"]


def read_csv(path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_precision_is_honoured_and_recorded_and_the_fused_baseline_named(workdir, capsys):
    for precision in ("32", "bf16"):
        main(["profile", *TINY, "model=linear", "baseline=softmax", "profile.fused_baseline=softmax",
              f"trainer.precision={precision}", f"profile.output=p{precision}.csv"])
    out = " ".join(capsys.readouterr().out.split())
    (full,), (half,) = read_csv(workdir / "p32.csv"), read_csv(workdir / "pbf16.csv")
    assert set(grid.FUSED_COLUMNS) <= set(full) and full["precision"] == "32" and half["precision"] == "bf16"
    assert full["regime"].startswith("float32") and half["regime"].startswith("bf16 autocast")
    assert "(cpu, float32)" in out and "(cpu, bf16)" in out  # the table's title says it too
    # the step ran under autocast: bf16 activations (the tracked peak) and another time
    assert int(half["model_peak_mem_train_bytes"]) < int(full["model_peak_mem_train_bytes"])
    assert half["model_time_train_s"] != full["model_time_train_s"]
    for row in (full, half):  # today's softmax beside the paper's, with what actually ran
        assert row["fused_baseline"] == "softmax" and row["fused_status"] == "ok"
        assert float(row["ratio_fused_time_train_s"]) > 0 and float(row["ratio_fused_peak_mem_train_bytes"]) > 0
        assert "flash_attention_for_cpu" in row["fused_sdpa_kernels"]  # no dropout: the CPU's fused kernel
    assert "time train / fused" in out and "SDPA kernels that ran (not those asked for)" in out


def test_fp16_on_the_cpu_is_one_line(workdir, capsys):
    with pytest.raises(SystemExit) as e:
        main(["profile", *TINY, "trainer.precision=fp16", "profile.output=p.csv"])
    assert e.value.code == 2
    assert "trainer.precision=fp16 needs CUDA" in capsys.readouterr().err


def test_table4_baseline_under_checkpointing_peaks_lower(workdir):
    """The Table 4 preset checkpoints the Transformer's attention as lra_config.py asks: its tracked
    training peak (MemTracker on fake tensors, sdpa math: the N x N scores) is lower than without."""
    base = ["profile=primal_lra_efficiency", "profile.tasks=null", "profile.seq_lens=[256]", "profile.batch_size=1",
            "profile.models=[linformer]", "profile.timing.enabled=false", "profile.flops=off", "profile.paper=null",
            "profile.report=null", "trainer.progress=false"]
    main(["profile", *base, "profile.output=ckpt.csv"])
    main(["profile", *base, "profile.regime.checkpoint_attention=[]", "profile.output=plain.csv"])
    (checkpointed,), (plain,) = read_csv(workdir / "ckpt.csv"), read_csv(workdir / "plain.csv")
    assert "checkpointed attention: softmax" in checkpointed["regime"] and "checkpointed" not in plain["regime"]
    assert int(checkpointed["baseline_peak_mem_train_bytes"]) < int(plain["baseline_peak_mem_train_bytes"])
    # the model (linformer: not checkpointed by the authors) is measured the same way in both
    assert checkpointed["model_peak_mem_train_bytes"] == plain["model_peak_mem_train_bytes"]


def test_the_attention_kernel_runs_in_float32_under_autocast(monkeypatch):
    """attention.py of the authors' LRA code: projections under AMP, the kernel in float32 with autocast off."""
    import torch

    from bench_cli.engine.attention_regime import apply_attention_regime
    from attnbench.models.attention import build_attention

    layer = build_attention("softmax", d_model=16, n_heads=2)
    seen, kernel = [], type(layer).kernel
    monkeypatch.setattr(type(layer), "kernel", lambda self, q, *rest: seen.append(q.dtype) or kernel(self, q, *rest))
    assert apply_attention_regime(layer, float32=True, checkpointed=True) == 1
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = layer(torch.randn(2, 8, 16, requires_grad=True))
    out.float().sum().backward()  # the checkpointed kernel runs again in the backward, in float32 too
    assert out.dtype == torch.bfloat16 and seen == [torch.float32, torch.float32]
    assert apply_attention_regime(layer, float32=False, checkpointed=False) == 0
