"""Every ending of a run leaves its row, produced for real through `attnbench run`: ok, failed (with
error.txt), nan (a diverging optimiser), oom (a real allocation failure of the CPU allocator),
interrupted (SIGINT and SIGTERM sent to a run in a process of its own); and the CSV survives a
process that dies in the middle of rewriting it."""
from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pytest

from bench_cli.commands.cli import main
from bench_cli.results.csv_store import read_records

pytestmark = pytest.mark.slow

TINY = ["task.dataset=Fixture", "task.backbone.d_model=16", "task.backbone.n_heads=2", "task.backbone.n_layers=1",
        "task.backbone.d_ff=32", "trainer.max_epochs=2", "trainer.batch_size=8", "trainer.progress=false",
        "results.path=res.csv"]


def run_failing(*args: str) -> None:
    """`attnbench run` for a run that ends badly: it records its row, then exits 1."""
    with pytest.raises(SystemExit) as e:
        main(["run", *TINY, *args])
    assert e.value.code == 1


def one_row(workdir) -> dict:
    rows = read_records(workdir / "res.csv")
    assert len(rows) == 1, rows
    return rows[0]


def test_ok(uea_fixture, workdir):
    main(["run", *TINY])
    row = one_row(workdir)
    assert row["status"] == "ok" and row["error"] == "" and float(row["test_accuracy"]) > 0
    assert not (Path(row["output_dir"]) / "error.txt").exists()


def test_nan_when_the_loss_diverges(uea_fixture, workdir):
    """SGD at lr 1e30 without clipping: the first step sends the weights to about 1e30, so the next
    loss is not finite. The run stops at once, records nan with the epoch and batch, and returns."""
    run_failing("trainer.optimizer.name=sgd", "trainer.optimizer.lr=1e30", "trainer.grad_clip=null")
    row = one_row(workdir)
    assert row["status"] == "nan", row["error"]
    assert row["error"].startswith("DivergedError: loss is") and "epoch 1" in row["error"]
    assert row["test_accuracy"] == ""
    assert "DivergedError" in (Path(row["output_dir"]) / "error.txt").read_text()


def test_failed_keeps_the_traceback_in_error_txt(uea_fixture, workdir, monkeypatch):
    """A crash inside training (here the evaluation raising after the first epoch) is a row with
    status failed, the error's first line, and the whole traceback in the run folder's error.txt."""
    from attnbench.tasks.uea import UEAClassification

    def broken(self, model, split, ctx):
        raise RuntimeError("evaluation exploded")

    monkeypatch.setattr(UEAClassification, "evaluate", broken)
    run_failing()
    row = one_row(workdir)
    assert row["status"] == "failed" and row["error"] == "RuntimeError: evaluation exploded"
    trace = (Path(row["output_dir"]) / "error.txt").read_text()
    assert trace.startswith("Traceback") and "def broken" not in trace and "evaluation exploded" in trace
    assert (Path(row["output_dir"]) / "record.json").is_file()


def test_oom_from_a_real_allocation_failure(uea_fixture, workdir, monkeypatch):
    """The first training step asks the CPU allocator for an impossible tensor (2**60 bytes): a real
    allocation failure, as a too-large batch gives. The row says oom, not failed."""
    import torch

    from bench_cli.engine.trainer import Trainer

    real = Trainer.forward_loss

    def greedy(self, batch):
        torch.empty(2**60, dtype=torch.uint8)
        return real(self, batch)

    monkeypatch.setattr(Trainer, "forward_loss", greedy)
    run_failing()
    row = one_row(workdir)
    assert row["status"] == "oom", row["error"]
    assert "allocate" in row["error"] and (Path(row["output_dir"]) / "error.txt").is_file()


def start_run(workdir, *extra):
    """A run training for a long time in a process of its own (tests/command_processes.py: forked
    with torch and the engine imported, the console script's entry called), output to a file;
    returns once training has started (its first evaluation line), so a signal lands inside the
    training loop."""
    from command_processes import start_command

    log = workdir / "run.log"
    proc = start_command(["run", *TINY, "trainer.max_epochs=100000", *extra], log)
    deadline = time.monotonic() + 120
    while "epoch 1" not in log.read_text():
        assert proc.is_alive(), log.read_text()
        assert time.monotonic() < deadline, "the run never reached its first evaluation"
        time.sleep(0.2)
    return proc


@pytest.mark.xdist_group("forkserver")  # the preloaded forkserver (tests/ddp_processes.py) started once
@pytest.mark.parametrize("sig, name, code", [(signal.SIGINT, "Ctrl-C", 130), (signal.SIGTERM, "SIGTERM", 143)])
def test_interrupted_by_a_signal(uea_fixture, workdir, sig, name, code):
    if sys.platform == "win32":
        pytest.skip("POSIX signals")
    proc = start_run(workdir)
    try:
        os.kill(proc.pid, sig)
        proc.join(timeout=60)
        assert proc.exitcode == code
    finally:  # never leave a 100000-epoch run behind when the test fails
        if proc.is_alive():
            proc.kill()
            proc.join()
    out = (workdir / "run.log").read_text()
    assert "Traceback" not in out and f"interrupted ({name})" in out
    row = one_row(workdir)
    assert row["status"] == "interrupted" and row["error"] == f"interrupted ({name})"
    assert (Path(row["output_dir"]) / "record.json").is_file()


@pytest.mark.xdist_group("forkserver")  # the preloaded forkserver (tests/ddp_processes.py) started once
def test_csv_survives_a_process_dying_mid_rewrite(uea_fixture, workdir):
    """A second run dies (os._exit, as kill -9 would) after writing the new CSV to its temporary
    file and before renaming it over the original: the original file is byte for byte intact, and
    a later run appends to it normally."""
    main(["run", *TINY])
    before = (workdir / "res.csv").read_bytes()
    from command_processes import start_code

    code = ("import os, sys; from bench_cli.commands.cli import main\n"
            "os.replace = lambda *a, **k: os._exit(9)\n"
            f"main(['run', *{TINY!r}])\n")
    dying = start_code(code, [], workdir / "dying.log")
    dying.join(timeout=300)
    assert dying.exitcode == 9, (workdir / "dying.log").read_text()
    assert (workdir / "res.csv").read_bytes() == before
    main(["run", *TINY, "seed=1"])
    rows = read_records(workdir / "res.csv")
    assert [r["seed"] for r in rows] == ["0", "1"] and all(r["status"] == "ok" for r in rows)
