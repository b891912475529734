"""Checkpoints and exact resume through `attnbench run`: a run stopped midway (a termination
signal, handled at the next step boundary; or a crash between checkpoints) and rerun with the same
overrides ends with the record of an uninterrupted run, bit for bit in every metric, the selected
evaluation and every history row; for an epoch schedule (the UEA fixture, with and without
patience, a Primal model with its KSVD term) and a step schedule (generated ListOps with gradient
accumulation and a step-wise evaluation). Checkpoint files are read without running code."""
from __future__ import annotations

import json
import os
import pickle
import re
import signal
import time
from pathlib import Path

import pytest
import torch

from bench_cli.engine.checkpoint import CheckpointError, read
from bench_cli.commands.cli import main
from bench_cli.results.csv_store import read_records
from bench_cli.engine.trainer import _Loop
from test_lra import write_listops

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("single_thread")]

UEA = ["task.dataset=Fixture", "task.backbone.d_model=16", "task.backbone.n_heads=2", "task.backbone.n_layers=1",
       "task.backbone.d_ff=32", "trainer.batch_size=8", "trainer.progress=false", "trainer.max_epochs=4",
       "measure.flops=false", "measure.memory=false", "trainer.num_threads=1"]
LISTOPS = ["task=lra_listops", "task.dataset=listops_generated", "task.max_len=64", "task.seq_len=64",
           "task.backbone.d_model=16", "task.backbone.d_ff=32", "trainer.max_steps=6", "trainer.eval_every_steps=2",
           "trainer.batch_size=8", "trainer.micro_batch_size=4", "trainer.eval_batch_size=16", "trainer.progress=false",
           "trainer.optimizer.name=adamw", "trainer.scheduler.name=onecycle", "trainer.scheduler.warmup_steps=1",
           "measure.flops=false", "measure.memory=false", "trainer.num_threads=1", "model=softmax"]
# columns that describe the sitting, not the result
from bench_cli.results.schema import TIMING_COLUMNS  # noqa: E402

SITTING = {"run_id", "time", "wall_time_s", "train_time_s", "time_per_epoch_s", "measure_time_s", "peak_rss_bytes",
           "output_dir", "config_path", "overrides", "command", "resumed_from", "resumed_epoch", "resumed_step",
           "sittings", "checkpoint_dir", "checkpoint_bytes", "git_dirty", "metrics_json", *TIMING_COLUMNS}  # times and the machine's load


def interrupt_at(monkeypatch, step: int, how: str) -> None:
    """After optimiser step ``step`` (once): SIGTERM / SIGUSR1 / SIGHUP to this process (the run
    stops at the next step boundary), or ``crash``: an exception there and then (the rerun
    continues from the last checkpoint written before)."""
    original, fired = _Loop.optimiser_step, []

    def step_then_stop(self):
        original(self)
        if self.step == step and not fired:
            fired.append(True)
            if how == "crash":
                raise RuntimeError("simulated crash")
            signal.raise_signal(getattr(signal, how))

    monkeypatch.setattr(_Loop, "optimiser_step", step_then_stop)


def run(*args: str) -> None:
    try:
        main(["run", *args])
    except SystemExit as e:
        assert e.code in (None, 0), e.code


def interrupted_then_resumed(monkeypatch, capsys, args, step: int, how: str) -> tuple[dict, dict, list[dict]]:
    """(the uninterrupted record, the record of the interrupted run's rerun, the positions of the
    checkpoints left after the interruption)."""
    run(*args, "results.path=straight/res.csv")
    reference = read_records("straight/res.csv")[-1]
    with monkeypatch.context() as m:
        interrupt_at(m, step, how)
        with pytest.raises(SystemExit) as e:
            main(["run", *args, "results.path=cut/res.csv"])
        assert e.value.code == (1 if how == "crash" else 128 + getattr(signal, how))
    first = read_records("cut/res.csv")[-1]
    assert first["status"] == ("failed" if how == "crash" else "interrupted"), first
    if how != "crash":
        assert first["error"] == f"interrupted ({how})"
        assert "the same command resumes from its checkpoint" in capsys.readouterr().err
    left = [read(p)["position"] for p in sorted(Path(first["checkpoint_dir"]).glob("ckpt-*.pt"))]
    run(*args, "results.path=cut/res.csv")
    resumed = read_records("cut/res.csv")[-1]
    return reference, resumed, left


def assert_same_result(reference: dict, resumed: dict) -> None:
    assert resumed["status"] == "ok" == reference["status"], resumed.get("error")
    differ = {k for k in reference.keys() | resumed.keys() if k not in SITTING and reference.get(k) != resumed.get(k)}
    assert not differ, {k: (reference.get(k), resumed.get(k)) for k in differ}
    history = json.loads(reference["metrics_json"])["history"]
    assert json.loads(resumed["metrics_json"])["history"] == history and len(history) > 1
    assert resumed["job_key"] == reference["job_key"]
    assert reference["sittings"] == "1" and reference["resumed_from"] == ""
    assert resumed["sittings"] == "2" and resumed["resumed_from"].endswith(".pt")
    assert float(resumed["train_time_s"]) > 0
    assert not Path(resumed["checkpoint_dir"]).exists()  # an ok job's checkpoints are removed


@pytest.mark.parametrize("extra, step, how", [
    ([], 6, "SIGTERM"),  # inside epoch 2: the epoch's first batches are drawn again and skipped
    (["trainer.early_stopping.patience=2", "trainer.max_epochs=6"], 3, "SIGUSR1"),  # before any evaluation
    ([], 7, "crash"),  # from the checkpoint of epoch 1
    (["model=primal", "model.attention.low_rank=4", "model.attention.rank_multi=2", "model.eta=0.2"], 5, "SIGHUP"),
    (["trainer.num_workers=1"], 6, "SIGTERM"),  # a loader worker process draws the batches
])
def test_uea_run_resumes_to_the_uninterrupted_record(uea_fixture, workdir, monkeypatch, capsys, extra, step, how):
    reference, resumed, left = interrupted_then_resumed(monkeypatch, capsys, [*UEA, *extra], step, how)
    assert len(left) == 1  # keep: 1
    assert_same_result(reference, resumed)


@pytest.mark.parametrize("extra, step, how, saved", [
    ([], 3, "SIGTERM", 3),  # the signal's boundary: between evaluations, with training losses not yet read
    ([], 5, "crash", 4),  # the evaluation's checkpoint
    (["trainer.checkpoint.every=3"], 5, "crash", 3),  # every 3 optimiser steps
])
def test_step_schedule_resumes_to_the_uninterrupted_record(workdir, monkeypatch, capsys, extra, step, how, saved):
    write_listops(workdir / "data" / "lra_generated" / "listops-1000")
    reference, resumed, left = interrupted_then_resumed(monkeypatch, capsys, [*LISTOPS, *extra], step, how)
    assert [p["step"] for p in left] == [saved]
    assert_same_result(reference, resumed)


def test_an_interrupted_run_has_stopped_its_loader_workers_when_it_returns(uea_fixture, workdir, monkeypatch):
    """A run in this process stopped by SIGTERM with a loader worker: the worker has exited when the
    run returns. Kept alive by the interruption's traceback, it was stopped by a later garbage
    collection, which then waited 5 s for it in whatever ran next."""
    import multiprocessing

    before = set(multiprocessing.active_children())
    with monkeypatch.context() as m:
        interrupt_at(m, 6, "SIGTERM")
        with pytest.raises(SystemExit) as stopped:
            main(["run", *UEA, "trainer.num_workers=1", "results.path=res.csv"])
    assert stopped.value.code == 128 + signal.SIGTERM
    assert set(multiprocessing.active_children()) <= before


def test_resume_must_without_a_checkpoint_is_one_line_before_the_run(uea_fixture, workdir, capsys):
    with pytest.raises(SystemExit) as e:
        main(["run", *UEA, "results.path=res.csv", "trainer.resume=must"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "trainer.resume=must: no checkpoint of job " in err and len(err.strip().splitlines()) == 1
    assert read_records("res.csv") == []


def test_resume_false_starts_over_and_keep_final_keeps(uea_fixture, workdir, monkeypatch):
    with monkeypatch.context() as m:
        interrupt_at(m, 6, "SIGTERM")
        with pytest.raises(SystemExit):
            main(["run", *UEA, "results.path=res.csv"])
    run(*UEA, "results.path=res.csv", "trainer.resume=false", "trainer.checkpoint.keep_final=true")
    row = read_records("res.csv")[-1]
    assert row["status"] == "ok" and row["sittings"] == "1" and row["resumed_from"] == ""
    kept = sorted(Path(row["checkpoint_dir"]).glob("ckpt-*.pt"))
    assert len(kept) == 1 and int(row["checkpoint_bytes"]) == kept[0].stat().st_size
    assert read(kept[0])["position"]["finished"]


def test_a_truncated_checkpoint_is_one_line(uea_fixture, workdir, monkeypatch, capsys):
    with monkeypatch.context() as m:
        interrupt_at(m, 6, "SIGTERM")
        with pytest.raises(SystemExit):
            main(["run", *UEA, "results.path=res.csv"])
    (path,) = Path(read_records("res.csv")[-1]["checkpoint_dir"]).glob("ckpt-*.pt")
    path.write_bytes(path.read_bytes()[:1000])
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        main(["run", *UEA, "results.path=res.csv", "trainer.resume=must"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert f"checkpoint {path} is unreadable" in err and "trainer.resume=must" in err and "Traceback" not in err
    run(*UEA, "results.path=res.csv")
    err = capsys.readouterr().err
    assert f"checkpoint {path} is unreadable" in err and "starting over from the beginning" in err
    row = read_records("res.csv")[-1]
    assert row["status"] == "ok" and row["sittings"] == "1"


class RunsCode:
    def __reduce__(self):
        return (Path.touch, (Path("pwned"),))


def test_a_checkpoint_whose_pickle_would_run_code_is_refused_unrun(workdir):
    path = workdir / "ckpt-000001.pt"
    torch.save({"format": 1, "model": RunsCode()}, path)
    with pytest.raises(CheckpointError, match="refused unread"):
        read(path)
    assert not (workdir / "pwned").exists()
    pickle.loads(pickle.dumps(RunsCode()))  # the payload works when unpickled without the guard
    assert (workdir / "pwned").exists()


@pytest.mark.xdist_group("forkserver")  # the preloaded forkserver (tests/ddp_processes.py) started once
def test_a_signal_to_the_console_script_checkpoints_and_the_same_command_resumes(uea_fixture, workdir, capsys):
    """As Slurm does it before a time limit: SIGUSR1 to the running `attnbench run` process (the
    console script's entry in a process of its own: tests/command_processes.py; the other signals
    take the same path: above); the row says interrupted with the signal; the same command again
    (in this process: only the signal needs a process of its own) finishes with the uninterrupted
    record."""
    from command_processes import start_command

    sig = signal.SIGUSR1
    args = [*UEA, "trainer.max_epochs=12", "results.path=res.csv"]
    run(*[a for a in args if not a.startswith("results.path")], "results.path=straight/res.csv")
    proc = start_command(["run", *args], workdir / "run.log")
    try:
        deadline = time.monotonic() + 120
        while "epoch 2 " not in (workdir / "run.log").read_text():
            assert proc.is_alive(), (workdir / "run.log").read_text()
            assert time.monotonic() < deadline, "the run never reached its second evaluation"
            time.sleep(0.05)
        os.kill(proc.pid, sig)
        proc.join(timeout=60)
        assert proc.exitcode == 128 + sig, (workdir / "run.log").read_text()
    finally:
        if proc.is_alive():
            proc.kill()
            proc.join()
    first = read_records("res.csv")[-1]
    assert first["status"] == "interrupted" and first["error"] == f"interrupted ({sig.name})"
    assert int(first["checkpoint_bytes"]) > 0
    capsys.readouterr()
    run(*args)
    assert "resuming from" in capsys.readouterr().err
    assert_same_result(read_records("straight/res.csv")[-1], read_records("res.csv")[-1])


def test_evaluate_a_kept_checkpoint_gives_the_records_test_metrics(uea_fixture, workdir, capsys):
    run(*UEA, "results.path=res.csv", "trainer.checkpoint.keep_final=true")
    row = read_records("res.csv")[-1]
    (path,) = Path(row["checkpoint_dir"]).glob("ckpt-*.pt")
    capsys.readouterr()
    main(["evaluate", str(path), "--split", "test"])
    out = capsys.readouterr().out
    for metric in ("accuracy", "loss"):  # the selected weights' test metrics, as recorded
        value = f"{float(row['test_' + metric]):.6g}"
        assert re.search(rf"{metric}\W+{re.escape(value)} ", out), out
    assert "note" not in out

    state = torch.load(path, weights_only=True)
    state["meta"]["git_commit"] = "0" * 40
    state["model"] = {f"renamed.{k}": v for k, v in state["model"].items()}
    state["selection"]["weights"] = None
    torch.save(state, path)
    with pytest.raises(SystemExit) as e:
        main(["evaluate", str(path), "--weights", "last"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "does not fit the model this code builds from its config: missing " in err
    assert f"git_commit {'0' * 40}" in err and "Traceback" not in err
    with pytest.raises(SystemExit):
        main(["evaluate", str(path), "--split", "dev"])
    assert "unknown split 'dev'" in capsys.readouterr().err


def test_a_crash_while_writing_leaves_the_previous_checkpoint(workdir, monkeypatch):
    from bench_cli.engine import checkpoint

    ck = checkpoint.Checkpoints(workdir / "ck", checkpoint.Settings(every=0, keep=1, keep_final=False, resume="true"), "k", {}, 0.0)
    parts = {k: {} for k in checkpoint.PARTS if k not in ("job_key", "meta", "sittings", "wall_time_s")}
    first = ck.save({**parts, "position": {"step": 1}})
    before = first.read_bytes()

    def dies_midway(obj, f):
        f.write(b"PK\x03\x04 half a zip")
        raise OSError("No space left on device")

    monkeypatch.setattr(checkpoint.torch, "save", dies_midway)
    with pytest.raises(OSError):
        ck.save({**parts, "position": {"step": 2}})
    assert [p.name for p in (workdir / "ck").iterdir()] == [first.name] and first.read_bytes() == before
    assert read(first)["position"] == {"step": 1}


def test_a_launchers_own_handler_gets_the_signal_after_the_checkpoint(uea_fixture, workdir, monkeypatch):
    """Under submitit, SIGUSR2 is its requeue handler's (it requeues the Slurm job and exits): the
    run writes its checkpoint at the step boundary first, then hands the signal on; the record says
    interrupted by that signal, and the requeued job resumes to the uninterrupted record."""
    run(*UEA, "results.path=straight/res.csv")
    called = []

    def requeue_and_exit(signum, frame):  # what submitit's checkpoint_and_try_requeue does, minus scontrol
        called.append(signum)
        raise SystemExit(-1)

    previous = signal.signal(signal.SIGUSR2, requeue_and_exit)
    try:
        with monkeypatch.context() as m:
            interrupt_at(m, 6, "SIGUSR2")
            with pytest.raises(SystemExit):
                main(["run", *UEA, "results.path=cut/res.csv"])
    finally:
        signal.signal(signal.SIGUSR2, previous)
    assert called == [signal.SIGUSR2]
    first = read_records("cut/res.csv")[-1]
    assert first["status"] == "interrupted" and first["error"] == "interrupted (SIGUSR2)"
    assert [read(p)["position"]["step"] for p in Path(first["checkpoint_dir"]).glob("ckpt-*.pt")] == [6]
    run(*UEA, "results.path=cut/res.csv")
    assert_same_result(read_records("straight/res.csv")[-1], read_records("cut/res.csv")[-1])


def test_ctrl_c_during_a_checkpoint_write_waits_for_the_file_then_interrupts(workdir, monkeypatch):
    """Ctrl-C landing inside torch.save (its zip writer, cut, failed with "unexpected pos" and the
    run was recorded as a RuntimeError with exit status 1): the checkpoint is finished, then the
    KeyboardInterrupt comes (recorded as interrupted, exit 130)."""
    import threading

    from bench_cli.engine import checkpoint

    real_save = torch.save

    def save_interrupted(state, f):  # the signal arrives, at the main thread, while the file is half written
        signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)
        real_save(state, f)

    monkeypatch.setattr(checkpoint.torch, "save", save_interrupted)
    ck = checkpoint.Checkpoints(workdir / "ck", checkpoint.Settings(every=0, keep=1, keep_final=False, resume="true"), "k", {}, 0.0)
    parts = {k: {} for k in checkpoint.PARTS if k not in ("job_key", "meta", "sittings", "wall_time_s")}
    # Ctrl-C as a terminal's reaches a plain process: Python's handler, SIGINT not blocked. In the
    # full suite this test failed three times in five runs on 2026-11-28 (no KeyboardInterrupt)
    # and never alone: what an earlier test in the same worker left is not this test's subject.
    handler = signal.signal(signal.SIGINT, signal.default_int_handler)
    mask = signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    try:
        with pytest.raises(KeyboardInterrupt):
            ck.save({**parts, "position": {"step": 3}})
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # Ctrl-C is back to normal after it
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        signal.signal(signal.SIGINT, handler)
    (path,) = ck.files()
    assert read(path)["position"] == {"step": 3}
