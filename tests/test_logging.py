"""A run's history and its trackers (docs/logging.md): history.csv in every run folder (the
training loss every logger.log_every_n_steps steps and every evaluation; continued, not repeated,
by a resumed fit), wandb offline runs (group, tags, the resolved config in files/, the step losses,
the sync command in the summary; a resumed fit continues the same wandb run) and TensorBoard
scalars, each read back from the files written."""
from __future__ import annotations

import csv
import json
import os
import re
import struct
from pathlib import Path

import pytest
import torch

from bench_cli.commands.cli import main
from bench_cli.results.csv_store import read_records

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("single_thread")]

# 32 training series (the fixture's 40 less the holdout's validation split) at batch 8: 4
# optimiser steps per epoch; an evaluation after each epoch (steps 4, 8, 12)
TINY = ["task.dataset=Fixture", "task.backbone.d_model=16", "task.backbone.n_heads=2", "task.backbone.n_layers=1",
        "task.backbone.d_ff=32", "trainer.max_epochs=3", "trainer.batch_size=8", "trainer.progress=false",
        "measure.flops=false", "measure.memory=false", "trainer.num_threads=1"]


def run(*args: str) -> dict:
    main(["run", *args])
    return read_records("res.csv")[-1]


def history_csv(row: dict) -> list[dict]:
    with open(Path(row["output_dir"]) / "history.csv", newline="") as f:
        return list(csv.DictReader(f))


def test_history_csv_holds_the_step_losses_and_every_evaluation(uea_fixture, workdir):
    """Every step (log_every_n_steps=1): an evaluation's train_loss is the mean of the step losses
    since the previous one; every 3 steps: points at 3, 6, 9, 12, the evaluations at 4, 8, 12."""
    row = run(*TINY, "results.path=res.csv", "logger.log_every_n_steps=1", "trainer.max_epochs=2")
    rows = history_csv(row)
    assert [int(r["step"]) for r in rows] == list(range(1, 9))
    evaluations = json.loads(row["metrics_json"])["history"]
    by_step = {int(r["step"]): r for r in rows}
    start = 1
    for evaluation in evaluations:  # the record's history, column by column
        written = by_step[evaluation["step"]]
        assert all(float(written[k]) == pytest.approx(v, rel=1e-12) for k, v in evaluation.items()), written
        steps = [float(by_step[s]["train_loss_step"]) for s in range(start, evaluation["step"] + 1)]
        assert evaluation["train_loss"] == pytest.approx(sum(steps) / len(steps), rel=1e-6)
        start = evaluation["step"] + 1
    assert [int(r["epoch"]) for r in rows] == [1] * 4 + [2] * 4

    row = run(*TINY, "results.path=res.csv", "logger.log_every_n_steps=3")
    rows = history_csv(row)
    assert [int(r["step"]) for r in rows] == [3, 4, 6, 8, 9, 12]
    assert [r["train_loss_step"] != "" for r in rows] == [True, False, True, False, True, True]
    assert [r["val_accuracy"] != "" for r in rows] == [False, True, False, True, False, True]
    assert not list(Path(row["output_dir"]).glob("history.csv*.tmp"))


def test_a_resumed_fit_continues_its_history(uea_fixture, workdir, monkeypatch):
    """Crashed at step 7 (the checkpoint of epoch 1, step 4, is kept), rerun: the rerun's
    history.csv is the uninterrupted run's, row for row (exact resume: the same values)."""
    from test_checkpoint import interrupt_at

    args = [*TINY, "logger.log_every_n_steps=2"]
    straight = history_csv(run(*args, "results.path=res.csv"))
    with monkeypatch.context() as m:
        interrupt_at(m, 7, "crash")
        with pytest.raises(SystemExit):
            main(["run", *args, "results.path=cut/res.csv"])
    first = read_records("cut/res.csv")[-1]
    assert first["status"] == "failed"
    # what the first sitting read: step 6's point waited on the device for the next evaluation
    assert [int(r["step"]) for r in history_csv(first)] == [2, 4]
    main(["run", *args, "results.path=cut/res.csv"])
    resumed = read_records("cut/res.csv")[-1]
    assert resumed["sittings"] == "2" and resumed["output_dir"] != first["output_dir"]
    assert history_csv(resumed) == straight


@pytest.mark.parametrize("live", [False, True])
def test_step_losses_read_no_tensor_in_the_step_loop_unless_a_tracker_shows_them(uea_fixture, monkeypatch, tmp_path,
                                                                                    live):
    """The step losses are summed on the device. Without a live tracker no host read happens
    between evaluations (tests/test_overhead.py's count); with one, a read per point (a
    host-device sync every log_every_n_steps steps on a GPU), and none more."""
    from bench_cli.config.compose import compose
    from bench_cli.engine import trainer
    from bench_cli.results.loggers import HistoryCSV, Loggers, NullLogger
    from attnbench.tasks.uea import UEAClassification
    from test_overhead import TINY as OVERHEAD, HostReads

    class Live(NullLogger):
        live = True

    cfg = compose([*OVERHEAD, "task.protocol=paper"])
    task = UEAClassification(cfg.task, cfg.paths.data_root)
    task.setup("paper")
    model = task.build_model(cfg.model)
    reads = HostReads(monkeypatch)
    monkeypatch.setattr(trainer._Loop, "run", reads.during("steps", trainer._Loop.run))
    monkeypatch.setattr(trainer._Loop, "evaluate_and_select", reads.during("evaluation", trainer._Loop.evaluate_and_select))
    logger = Loggers(HistoryCSV(tmp_path), Live() if live else None, every_n_steps=2)
    result = trainer.Trainer(cfg.trainer, task, model, torch.device("cpu"), seed=0, logger=logger).fit("paper")
    logger.finish()
    points = result.steps_run // 2  # 40 training series at batch 8, 4 epochs: 20 steps
    in_steps = reads.in_phase("steps")
    assert sum(in_steps.values()) == (points if live else 0), in_steps
    assert all(where.startswith("loggers.py:") for _, where in in_steps)
    with open(tmp_path / "history.csv", newline="") as f:
        assert [int(r["step"]) for r in csv.DictReader(f) if r["train_loss_step"]] == list(range(2, 21, 2))


def wandb_records(folder: Path):
    """The records of an offline run's .wandb file (wandb's LevelDB-style log: a 7-byte header,
    then 32 KiB blocks of chunks, each with a 7-byte header: checksum, length, type)."""
    from wandb.proto import wandb_internal_pb2 as pb

    (path,) = folder.glob("*.wandb")
    data, pos, chunks = path.read_bytes(), 7, b""
    assert data[:4] == b":W&B"
    while pos + 7 <= len(data):
        left = 32768 - pos % 32768
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if left < 7 or (length == 0 and kind == 0):  # a block's padding
            pos += left
            continue
        chunks += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # a whole record, or the last chunk of one
            record = pb.Record()
            record.ParseFromString(chunks)
            chunks = b""
            yield record


def offline_run(folder: Path) -> dict:
    """What an offline run's .wandb file says: id, group, tags, files saved, history by step."""
    run, files, history = None, [], {}
    for record in wandb_records(folder):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            run = record.run
        elif kind == "files":
            files += [f.path for f in record.files.files]
        elif kind == "history":
            items = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.history.item}
            history.setdefault(items["_step"], {}).update(items)
    return {"id": run.run_id, "group": run.run_group, "tags": list(run.tags), "name": run.display_name,
            "files": files, "history": history}


WANDB = ["logger=wandb", "logger.log_every_n_steps=2", "results.path=res.csv"]


def wandb_env(workdir: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "WANDB_API_KEY"}
    return {**env, "WANDB_MODE": "offline", "WANDB_DIR": str(workdir)}


@pytest.mark.xdist_group("forkserver")  # the preloaded forkserver (tests/ddp_processes.py) started once
def test_wandb_offline_sittings_a_sweep_and_no_threads_left(uea_fixture, workdir):
    """wandb's offline runs, all made in one process (wandb's service and torch started once): a
    run stopped by a signal, the same run resumed, then a sweep of two jobs (the basic launcher:
    its jobs in that process too), then a run with an API key but no network (WANDB_MODE unset,
    the server unreachable), each followed by a look at the process's threads."""
    stop = ("import signal; from bench_cli.engine.trainer import _Loop; step = _Loop.optimiser_step\n"
            "def stop_at_6(self):\n"
            "    step(self)\n"
            "    if self.step == 6: signal.raise_signal(signal.SIGTERM)\n"
            "_Loop.optimiser_step = stop_at_6\n")
    threads = ("def threads_left(after):\n"
               "    left = [t.name for t in threading.enumerate() if t.name.startswith('wandb')]\n"
               "    print('wandb threads after', after, left)\n")
    # The first sitting with the step patched to stop, the second with the step as it is, then the
    # sweep; the second sitting's and the sweep's output are printed between markers, so that each
    # can be read alone.
    sweep = [*TINY, "trainer.max_epochs=1", *WANDB[:-1], "results.path=sweep.csv", "seed=0,1"]
    code = ("import sys, threading; from bench_cli.commands.cli import main\n" + stop + threads +
            "try:\n    main(['run', *sys.argv[1:]])\nexcept SystemExit as e:\n    print('first sitting exit', e.code)\n"
            "threads_left('the first sitting')\n"
            "_Loop.optimiser_step = step\nprint('--- second sitting ---')\n"
            "main(['run', *sys.argv[1:]])\n"
            "threads_left('the second sitting')\n"
            "print('tensorboard imported:', sorted({'tensorboard', 'torch.utils.tensorboard'} & set(sys.modules)))\n"
            f"print('--- sweep ---')\nmain(['sweep', *{sweep!r}])\n"
            "threads_left('the sweep')\n" + NO_NETWORK + "threads_left('the run without network')\n")
    from command_processes import start_code

    # forked with torch and the engine imported (tests/command_processes.py), wandb not
    done = start_code(code, [*TINY, *WANDB], workdir / "wandb.log", wandb_env(workdir))
    done.join(timeout=300)
    stdout = (workdir / "wandb.log").read_text()
    assert done.exitcode == 0, stdout[-2000:]
    sittings, swept = stdout.split("--- sweep ---")
    swept, without_network = swept.split("--- no network ---")
    check_offline_sittings_resume_and_say_how_to_sync(workdir, sittings)
    check_a_sweeps_runs_are_one_group(workdir, swept)
    check_a_key_without_network_logs_offline_at_once(workdir, without_network)
    check_each_run_logged_and_no_threads_left(workdir, stdout)


# A run with an API key (WANDB_MODE unset: online) where wandb's server does not answer (nothing
# listens on port 9), made after the offline runs above, in their process.
NO_NETWORK = ("import os, time; print('--- no network ---')\n"
              "os.environ.pop('WANDB_MODE', None); os.environ['WANDB_API_KEY'] = 'x' * 40\n"
              "os.environ['WANDB_BASE_URL'] = 'http://127.0.0.1:9'\n"
              "started = time.perf_counter(); main(['run', *sys.argv[1:], 'seed=3', 'results.path=offline.csv'])\n"
              "print('the run without network took', round(time.perf_counter() - started), 's')\n")


def check_a_key_without_network_logs_offline_at_once(workdir: Path, stdout: str) -> None:
    """With a key but no network, the run falls back to logging offline at once (not after minutes
    of wandb's retries), says so, and records its run."""
    assert "is not reachable; logging offline" in stdout, stdout[-2000:]
    took = int(re.search(r"the run without network took (\d+) s", stdout).group(1))
    assert took < 60, stdout[-2000:]
    (row,) = read_records(workdir / "offline.csv")
    assert row["status"] == "ok" and list(Path(row["output_dir"]).rglob("offline-run-*"))


def check_offline_sittings_resume_and_say_how_to_sync(workdir: Path, stdout: str) -> None:
    """A run stopped by a signal at step 6 (checkpointed there), run again. Each sitting's offline
    run: tags, the resolved config in files/, the step losses; the second has the first's id
    (`wandb sync` of both folders makes one run), logs from step 7 on (nothing twice), and its
    summary says where it is and the command that uploads both sittings."""
    assert "first sitting exit 143" in stdout, stdout[-2000:]  # interrupted by SIGTERM
    second_sitting = stdout.split("--- second sitting ---")[1]
    first, resumed = read_records(workdir / "res.csv")
    assert first["status"] == "interrupted" and resumed["sittings"] == "2"
    folders = [next(Path(row["output_dir"]).glob("wandb/offline-run-*")) for row in (first, resumed)]
    runs = [offline_run(f) for f in folders]
    assert runs[0]["id"] == runs[1]["id"]
    assert all({"uea", "Fixture", "softmax"} <= set(run["tags"]) for run in runs)
    for folder, row, run in zip(folders, (first, resumed), runs):  # the resolved config: a file, not a link out
        saved = folder / "files" / "attnbench" / "config.yaml"
        assert saved.is_file() and not saved.is_symlink() and "attnbench/config.yaml" in run["files"]
        assert saved.read_text() == Path(row["config_path"]).read_text()
    steps = [[s for s in sorted(run["history"]) if "train_loss_step" in run["history"][s]] for run in runs]
    assert steps == [[2, 4, 6], [8, 10, 12]]
    assert [s for s in sorted(runs[1]["history"]) if "val_accuracy" in runs[1]["history"][s]] == [8, 12]
    written = {int(r["step"]): r for r in history_csv(resumed)}  # the CSV holds both sittings' points
    assert all(runs[s > 6]["history"][s]["train_loss_step"] == pytest.approx(float(written[s]["train_loss_step"]))
               for s in (2, 6, 8, 12))
    # the summary: where the offline run is, the command that uploads both sittings (one line each)
    out = re.sub(r"\s+", " ", second_sitting)
    assert f"wandb offline run: {folders[1]}" in out, second_sitting[-2000:]
    assert f"upload it with: wandb sync {folders[0]} {folders[1]}" in out, second_sitting[-2000:]
    assert f"history: {Path(resumed['output_dir']) / 'history.csv'}" in out
    assert "tensorboard imported: []" in out  # only logger=tensorboard imports it


def check_a_sweeps_runs_are_one_group(workdir: Path, stdout: str) -> None:
    """The two jobs of one sweep: one group (the sweep's folder name), a name per job; the sweep's
    summary ends with the command that uploads both."""
    rows = read_records(workdir / "sweep.csv")
    assert len(rows) == 2
    logged = [offline_run(next(Path(row["output_dir"]).glob("wandb/offline-run-*"))) for row in rows]
    sweep_folder = Path(rows[0]["output_dir"]).parent
    assert [run["group"] for run in logged] == [f"sweep-{sweep_folder.name}"] * 2
    assert sorted(run["name"] for run in logged) == ["uea-Fixture-softmax-s0-job0", "uea-Fixture-softmax-s1-job1"]
    command = f"wandb sync {sweep_folder}/*/wandb/offline-run-*"  # at the sweep's end, for all its jobs
    assert f"wandb offline runs (2), upload them with: {command}" in re.sub(r"\s+", " ", stdout), stdout[-2000:]
    assert len(list(sweep_folder.glob("*/wandb/offline-run-*"))) == 2


def check_each_run_logged_and_no_threads_left(workdir: Path, stdout: str) -> None:
    """Runs one after the other in one process, as a sweep's basic launcher runs them: each logged
    offline (a .wandb file per run), and no wandb thread (the service's asyncio loop, its finaliser)
    left running after any of them. (In its own process: wandb's service never lives in the test
    process.)"""
    for after in ("the first sitting", "the second sitting", "the sweep", "the run without network"):
        assert f"wandb threads after {after} []" in stdout, stdout[-2000:]
    rows = read_records(workdir / "sweep.csv")
    assert [row["status"] for row in rows] == ["ok", "ok"]
    for row in [*rows, *read_records(workdir / "res.csv")]:
        runs = list(Path(row["output_dir"]).rglob("offline-run-*"))
        assert runs, "no offline wandb run was written"
        assert any(p.suffix == ".wandb" for p in runs[0].iterdir())


def test_tensorboard_scalars(uea_fixture, workdir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    row = run(*TINY, "results.path=res.csv", "logger=tensorboard", "logger.log_every_n_steps=2")
    events = EventAccumulator(str(Path(row["output_dir"]) / "tensorboard"))
    events.Reload()
    scalars = set(events.Tags()["scalars"])
    assert {"train_loss_step", "train_loss", "val_accuracy", "val_loss", "lr", "epoch"} <= scalars
    assert [e.step for e in events.Scalars("train_loss_step")] == [2, 4, 6, 8, 10, 12]
    history = json.loads(row["metrics_json"])["history"]
    logged = events.Scalars("val_accuracy")
    assert [e.step for e in logged] == [h["step"] for h in history]
    assert [e.value for e in logged] == pytest.approx([h["val_accuracy"] for h in history])  # float32 in the file
