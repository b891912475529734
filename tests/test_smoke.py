"""`attnbench smoke`: the GPU smoke check's plan for two pretend devices, its runner (a failed
check's reason is the run's own error), the data it finds or fetches (synthetic inputs without
it, a failed check under --require-data), and its refusal without CUDA. The plan's checks on the
CPU are tests/test_smoke_plan.py."""
from __future__ import annotations

import math
import os
from pathlib import Path

import pytest
import torch

from bench_cli.commands import smoke as smoke_command
from test_cli import fail_line


def test_without_cuda_one_line_exit_2(workdir, capsys, monkeypatch):
    """As on a machine without CUDA (here in this process: the exit status and the one line are the
    CLI's main's, which the console script returns as they are)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    err = fail_line(capsys, "smoke")
    assert "no CUDA device is visible" in err, err
    assert not (workdir / "results").exists()  # nothing ran, nothing written


def test_plan_covers_every_family_in_both_precisions_and_ddp_with_two_gpus(monkeypatch, tmp_path):
    monkeypatch.setattr(smoke_command, "half_precision", lambda device: "bf16")
    checks = smoke_command.plan(["cuda:0", "cuda:1"], tmp_path, missing={f.task: "no files" for f in smoke_command.FAMILIES})
    names = [c.name for c in checks]
    assert len(names) == len(set(names))
    for device in ("cuda:0", "cuda:1"):
        for family in smoke_command.FAMILIES:
            for precision in ("32", "bf16"):
                (check,) = [c for c in checks if c.name.startswith(f"{family.task} {precision} {device}")]
                assert f"trainer.precision={precision}" in check.argv and f"trainer.device={device}" in check.argv
                # every record goes to the smoke's own CSV, never results/runs.csv
                assert f"results.path={tmp_path / 'records.csv'}" in check.argv
        assert f"primal KSVD bf16 {device}" in names and f"profile timing {device}" in names
    (ddp,) = [c for c in checks if c.name.startswith("ddp")]
    assert "torch.distributed.run" in ddp.launcher and "trainer.strategy=ddp" in ddp.argv
    assert not [c for c in smoke_command.plan(["cuda:0"], tmp_path) if c.name.startswith("ddp")]  # one GPU: no DDP check


def test_a_family_with_its_data_present_trains_on_it(monkeypatch, tmp_path):
    monkeypatch.setattr(smoke_command, "half_precision", lambda device: "fp16")
    family = next(f for f in smoke_command.FAMILIES if f.task == "lra_retrieval")
    real, synthetic = (smoke_command.plan(["cuda:0"], tmp_path, (family,), missing=m)[0] for m in ({}, {"lra_retrieval": "x"}))
    assert real.argv[0] == "run" and not real.launcher and real.records == tmp_path / "records.csv"
    assert synthetic.argv[0] == "synthetic" and synthetic.launcher == smoke_command.SYNTHETIC and synthetic.note == "no data: x"
    assert synthetic.name == "lra_retrieval 32 cuda:0 (synthetic inputs)"


def test_the_cpu_plan_is_smaller_with_one_value_per_key(tmp_path):
    """On the CPU the checks take the CPU's batches and subsets and LRA Text at 256 bytes, each key
    once on the command line (the GPU's value replaced in its place)."""
    family = next(f for f in smoke_command.FAMILIES if f.task == "lra_text")
    gpu, cpu = (smoke_command.plan([d], tmp_path, (family,))[0].argv for d in ("cuda:0", "cpu"))
    assert "trainer.batch_size=8" in gpu and "task.subset.train=64" in gpu and "task.max_len=256" not in gpu
    assert {"trainer.batch_size=2", "task.subset.train=32", "task.max_len=256", "task.seq_len=256"} <= set(cpu)
    assert "trainer.max_steps=4" in gpu and "trainer.max_steps=2" in cpu
    keys = [a.split("=", 1)[0] for a in cpu[1:]]
    assert len(keys) == len(set(keys)), keys


def test_synthetic_steps_train_in_bf16_on_the_cpu():
    overrides = ["task=lra_retrieval", "trainer.device=cpu", "trainer.precision=bf16"]
    loss = smoke_command.synthetic_steps(overrides, steps=2, seq_len=64)
    assert math.isfinite(loss)


@pytest.mark.slow
def test_a_failing_check_is_a_line_with_its_reason(tmp_path):
    """In a process of its own, as `attnbench smoke` runs it: a mistake is the one line it printed."""
    status, seconds, reason = smoke_command.run_check(smoke_command.Check("bad", ("run", "task=nope")), timeout=120)
    assert status == "failed" and reason.startswith("exit 2: unknown task 'nope'"), reason
    rows = [{"check": "bad", "status": status, "seconds": f"{seconds:.1f}", "reason": reason}]
    smoke_command.write_checks(tmp_path / "checks.csv", rows)
    assert Path(tmp_path / "checks.csv").read_text().splitlines()[0] == "check,status,seconds,reason"


def test_ksvd_energy_is_float32_under_half_precision():
    """Half-precision e/r-scores (autocast's einsum output) enter the KSVD term in float32: e * e in
    fp16 overflows above 256 and the auxiliary loss would be inf."""
    from attnbench.models.attention import build_attention

    m = build_attention("primal", d_model=16, n_heads=2, low_rank=5, rank_multi=4)
    e = torch.full((1, 2, 3, 5), 300.0, dtype=torch.float16)
    m._record_ksvd(e, e.clone(), torch.zeros(1, 2), None)
    j = m.ksvd_objective
    assert j.dtype == torch.float32 and torch.isfinite(j).all() and torch.isfinite(m.auxiliary_loss())


# --- a failed check's reason: the run's own error -----------------------------------------------------
UEA = next(f for f in smoke_command.FAMILIES if f.task == "uea")
WARNING_SOURCE = "  return Variable._execution_engine.run_backward("  # the last line CUDA's run printed


def test_a_failed_runs_reason_is_its_recorded_error_not_the_last_line_printed(workdir, monkeypatch, capsys):
    """A run that fails inside training, then prints a warning's source line (as torch's backward
    did on CUDA): the reason is the exception of its record, type and message."""
    import sys

    from bench_cli.engine.trainer import Trainer

    def fit(self, protocol):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    def warn_after(row, *where):
        print(WARNING_SOURCE, file=sys.stderr)

    monkeypatch.setattr(Trainer, "fit", fit)
    monkeypatch.setattr("bench_cli.commands.cli.print_summary", warn_after)
    check = smoke_command.plan(["cpu"], workdir / "smoke", (UEA,))[0]
    status, _, reason = smoke_command.run_check(check, timeout=60, execute=smoke_command.in_process)
    assert (status, reason) == ("failed", "exit 1: RuntimeError: CUDA error: an illegal memory access was encountered")


def test_the_reason_falls_back_to_error_txt_and_to_the_error_line_printed(tmp_path):
    from bench_cli.results.csv_store import append_record

    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "error.txt").write_text("Traceback (most recent call last):\n  File \"x.py\", line 1\n"
                                      "KeyError: 'bleu'\n")
    append_record(tmp_path / "records.csv", {"status": "failed", "error": "", "output_dir": str(folder)})
    assert smoke_command.failure(tmp_path / "records.csv", 0, WARNING_SOURCE) == "KeyError: 'bleu'"
    # nothing recorded (a mistake found before the run, `profile`, synthetic inputs): what it said
    printed = f"error: unknown task 'nope'\n{WARNING_SOURCE}\n"
    assert smoke_command.failure(tmp_path / "none.csv", 0, printed) == "unknown task 'nope'"
    assert smoke_command.error_line(f"Traceback:\nValueError: bad shape\n{WARNING_SOURCE}") == "ValueError: bad shape"


def test_a_synthetic_check_that_fails_says_its_exception_in_one_line(monkeypatch):
    def steps(overrides):
        raise IndexError("index 7 is out of bounds")

    monkeypatch.setattr(smoke_command, "synthetic_steps", steps)
    check = smoke_command.Check("uea 32 cpu (synthetic inputs)", ("synthetic", "task=uea"), launcher=smoke_command.SYNTHETIC)
    assert smoke_command.run_check(check, timeout=60, execute=smoke_command.in_process)[2] == "exit 1: IndexError: index 7 is out of bounds"


# --- without the data: synthetic inputs, or a failed check under --require-data -----------------------
@pytest.fixture
def offline(workdir, monkeypatch):
    """CIFAR-10 cannot be downloaded (a node without internet); every check's command is recorded
    instead of run, but `attnbench data` runs, in this process."""
    import attnbench.tasks.lra.fetchers as fetchers

    monkeypatch.setattr(fetchers, "CIFAR10_URL", (workdir / "nowhere" / "cifar-10-python.tar.gz").as_uri())
    ran = []

    def execute(check, timeout):
        if check.argv[0] == "data":
            return smoke_command.in_process(check, timeout)
        ran.append(check)
        return 0, ""

    monkeypatch.setattr(smoke_command, "in_subprocess", execute)
    return ran


def smoke(capsys, *args: str) -> tuple[int, list[str]]:
    from bench_cli.commands.cli import main

    try:
        main(["smoke", "--device", "cpu", "--only", "lra_image", "--out", "smoke", *args])
        code = 0
    except SystemExit as e:
        code = e.code
    return code, capsys.readouterr().out.splitlines()


def test_a_family_without_data_trains_on_synthetic_inputs_and_says_so(workdir, offline, capsys):
    empty = workdir / "prepared"
    empty.mkdir()
    code, lines = smoke(capsys, "--data-root", str(empty))
    assert code == 0, lines
    (note,) = [ln for ln in lines if ln.startswith("no data lra_image:")]
    assert f"{empty}/cifar-10-batches-py" in note and note.endswith("its checks train on synthetic inputs")
    assert [c.argv[0] for c in offline if c.name.startswith("lra_image")] == ["synthetic", "synthetic"]
    assert any(ln.startswith("ok     lra_image bf16 cpu (synthetic inputs)") for ln in lines), lines
    assert "synthetic inputs for lra_image" in lines[-1] and "attnbench ls datasets" in lines[-1]


def test_require_data_makes_missing_data_a_failed_check_naming_where_it_goes(workdir, offline, capsys):
    code, lines = smoke(capsys, "--require-data")
    assert code == 1
    (failed,) = [ln for ln in lines if ln.startswith("failed")]
    assert failed.startswith("failed lra_image data") and f"{workdir}/data/cifar-10-batches-py" in failed
    assert not [c for c in offline if c.name.startswith("lra_image")]  # nothing to train on: not run
    assert "lra_image data,failed" in (workdir / "smoke" / "checks.csv").read_text()


def test_data_root_points_the_checks_at_prepared_data(workdir, offline, capsys):
    from image_data import write_cifar10

    write_cifar10(workdir / "prepared" / "cifar-10-batches-py")
    code, lines = smoke(capsys, "--data-root", str(workdir / "prepared"), "--require-data")
    assert code == 0 and not [ln for ln in lines if ln.startswith("no data")], lines
    assert [c.argv[0] for c in offline if c.name.startswith("lra_image")] == ["run", "run"]
    assert os.environ["ATTNBENCH_DATA"] == str(workdir / "prepared")  # the checks' processes inherit it
