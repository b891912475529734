"""Faults and bad input, as a new user meets them: nothing recorded is lost, no setting is silently
ignored, one clear line (exit status 2) for every mistake, output a person can read."""
from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import numpy as np
import pytest

from bench_cli.commands.cli import main
from bench_cli.results.csv_store import read_records

TINY = ["task.dataset=Fixture", "task.backbone.d_model=16", "task.backbone.n_heads=2", "task.backbone.n_layers=1",
        "task.backbone.d_ff=32", "trainer.max_epochs=2", "trainer.batch_size=8", "trainer.progress=false",
        "measure.flops=false", "measure.memory=false"]


def exit_line(capsys, *args: str, code: int = 2) -> str:
    with pytest.raises(SystemExit) as e:
        main(list(args))
    assert e.value.code == code
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


# --- results are never lost -------------------------------------------------------------------------
def test_unwritable_results_path_is_refused_before_training(uea_fixture, workdir, capsys, monkeypatch):
    import bench_cli.results.csv_store as csv_store

    ro = workdir / "ro"  # a read-only filesystem, as os.access reports it (root may write anywhere else)
    ro.mkdir()
    real_access = os.access
    monkeypatch.setattr(csv_store.os, "access", lambda p, mode: False if Path(p) == ro else real_access(p, mode))
    err = exit_line(capsys, "run", *TINY, f"results.path={ro / 'runs.csv'}")
    assert "cannot write" in err and not list((workdir / "outputs").glob("runs/*/*"))
    (workdir / "afile").write_text("x")  # a results folder that is a file
    assert "cannot write" in exit_line(capsys, "run", *TINY, f"results.path={workdir / 'afile' / 'runs.csv'}")


def test_failed_append_keeps_the_record_in_the_run_folder(uea_fixture, workdir, capsys, monkeypatch):
    import bench_cli.results.csv_store as csv_store

    def full_disk(path, row):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(csv_store, "append_record", full_disk)
    with pytest.raises(SystemExit) as e:
        main(["run", *TINY, "results.path=res.csv"])
    assert e.value.code == 1
    err = capsys.readouterr().err
    assert "No space left on device" in err and "record.json" in err
    (record,) = (workdir / "outputs").glob("runs/*/*/record.json")
    assert json.loads(record.read_text())["status"] == "ok"


def test_a_file_that_is_not_a_record_file_is_refused(uea_fixture, workdir, capsys):
    notes = workdir / "notes.csv"
    notes.write_text("my notes, do not touch\nline two\n")
    err = exit_line(capsys, "run", *TINY, f"results.path={notes}")
    assert "not an attnbench record file" in err
    assert notes.read_text() == "my notes, do not touch\nline two\n"


def test_ctrl_c_is_one_line_and_an_interrupted_record(uea_fixture, workdir, capsys, monkeypatch):
    from bench_cli.engine.trainer import Trainer

    def interrupted(self, protocol):
        raise KeyboardInterrupt

    monkeypatch.setattr(Trainer, "fit", interrupted)
    err = exit_line(capsys, "run", *TINY, "results.path=res.csv", code=130)
    assert "interrupted" in err and "Traceback" not in err
    (row,) = read_records(workdir / "res.csv")
    assert row["status"] == "interrupted"


def test_ctrl_c_in_any_other_command_is_one_line(workdir, capsys):
    from bench_cli.commands import cli

    def interrupted(args):
        raise KeyboardInterrupt

    with cli.COMMANDS.restoring():
        cli.COMMANDS.register("interrupted-verb", interrupted, owner=__name__)
        err = exit_line(capsys, "interrupted-verb", "uea", "JapaneseVowels", code=130)
    assert "interrupted" in err and "interrupted-verb" in err


def test_a_killed_run_shows_as_started_and_not_finished(uea_fixture, workdir, capsys):
    main(["run", *TINY, "results.path=res.csv"])
    (folder,) = (workdir / "outputs").glob("runs/*/*")
    killed = folder.parent / "killed-run"
    killed.mkdir()
    (killed / "config.yaml").write_text((folder / "config.yaml").read_text())
    marker = json.loads((folder / "run.json").read_text())
    (killed / "run.json").write_text(json.dumps({**marker, "run_id": "killed-run", "pid": 2**22 + 12345}))
    capsys.readouterr()
    main(["ls", "runs"])
    out = capsys.readouterr().out
    assert "killed-run" in out and "started, not finished" in out and "ok" in out


# --- no setting silently ignored ----------------------------------------------------------------------
@pytest.mark.parametrize("override, expected", [
    ("+trainer.max_epoch=1", "nothing reads trainer.max_epoch"),
    ("+foo.bar=1", "nothing reads foo.bar"),
    ("trainer.max_epoch=1", "did you mean 'trainer.max_epochs'"),
    ("trainer.optimizer.name=adamx", "unknown trainer.optimizer.name 'adamx'"),
    ("trainer.max_epochs=0", "trainer.max_epochs"),
    ("trainer.batch_size=0", "trainer.batch_size"),
    ("trainer.step_budget=abc", "trainer.step_budget"),
    ("task.val_fraction=1.5", "task.val_fraction: 1.5 (expected a number strictly between 0 and 1)"),
    ("trainer.optimizer.lr=0", "trainer.optimizer.lr: 0 (expected a number greater than 0)"),
    ("trainer.max_epochs=-2", "trainer.max_epochs: -2 (expected an integer of at least 1)"),
    ("model.attention.nonsense=1", "unknown config key 'model.attention.nonsense'; keys of model.attention: "),
    # nothing close: the keys that exist where the name stops matching, not a bare "unknown"
    ("trainer.colour=1", "unknown config key 'trainer.colour'; keys of trainer: accumulate_grad_batches, "),
    ("records.path=x", "; top-level keys: baseline, "),
    ("trainer.optimizer.nme=adam", "did you mean 'trainer.optimizer.name'"),
])
def test_bad_settings_are_refused_by_validate_and_run_alike(uea_fixture, workdir, capsys, override, expected):
    for command in ("validate", "run"):
        err = exit_line(capsys, command, *TINY, override, "results.path=res.csv")
        assert expected in err, err
        assert "to add a new key use +trainer" not in err
    assert not (workdir / "res.csv").exists()


def test_cuda_on_a_cpu_machine_is_refused(uea_fixture, workdir, capsys, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # a CPU machine, wherever the suite runs
    for command in ("validate", "run"):
        assert "CUDA is not available" in exit_line(capsys, command, *TINY, "trainer.device=cuda", "results.path=res.csv")
        # fp16 with trainer.device=auto: this machine's auto is the CPU (a GPU node's would be CUDA)
        assert "fp16 needs CUDA" in exit_line(capsys, command, *TINY, "trainer.precision=fp16", "results.path=res.csv")
    assert not (workdir / "res.csv").exists() and not (workdir / "outputs").exists()  # refused before the run


def test_conv2d_grid_that_does_not_fit_is_refused_by_validate(uea_fixture, workdir, capsys):
    err = exit_line(capsys, "validate", *TINY, "model=conv2d", "model.attention.grid=[2,2]")
    assert "conv2d" in err and "grid 2x2" in err and "\n" not in err.strip()


def test_an_experiment_grid_is_not_run_as_one_job(capsys, workdir):
    err = exit_line(capsys, "run", "experiment=primal_dual/table1")
    assert "grid of 200 jobs" in err and "attnbench sweep experiment=primal_dual/table1" in err


def test_data_and_report_usage_errors(capsys, workdir):
    assert "unknown option --some-option" in exit_line(capsys, "data", "uea", "JapaneseVowels", "--some-option")
    assert "give the experiment" in exit_line(capsys, "report")


# --- output a person can read ---------------------------------------------------------------------------
def test_redirected_run_prints_a_line_per_evaluation_and_names_csv_and_folder(uea_fixture, workdir, capsys,
                                                                              monkeypatch):
    """Output to a file, not a terminal (here captured: in-process, as a redirected process writes)."""
    monkeypatch.setenv("COLUMNS", "80")
    main(["run", *[a for a in TINY if a != "trainer.progress=false"], "trainer.max_epochs=3", "results.path=res.csv"])
    stdout = capsys.readouterr().out
    lines = [line for line in stdout.splitlines() if line.startswith("epoch ")]  # no bar's frame off a terminal
    assert len(lines) == 3 and all("train loss" in line and "val accuracy" in line for line in lines)
    (row,) = read_records(workdir / "res.csv")
    folder = Path(row["output_dir"])
    assert folder.name == row["run_id"]  # one id everywhere
    flat = stdout.replace("\n", "").replace("│", "").replace(" ", "")
    assert "res.csv" in flat and row["run_id"] in flat and str(folder).replace(" ", "") in flat
    log = next(folder.glob("*.log")).read_text()
    assert log.count("[attnbench.train]") == 3


def test_report_writes_beside_its_records(workdir, capsys):
    from bench_cli.results.csv_store import append_record

    scratch = workdir / "scratch" / "runs.csv"
    for seed in (0, 1):
        append_record(scratch, {"run_id": f"r{seed}", "status": "ok", "task": "uea", "dataset": "JapaneseVowels",
                                "model": "softmax", "seed": seed, "experiment": "primal_dual/table1",
                                "test_accuracy": 98.0 + seed, "variant_key": "v", "command": "attnbench sweep x=1"})
    main(["report", "primal_dual/table1", f"--records={scratch}"])
    out = capsys.readouterr().out
    report = workdir / "scratch" / "reproduced" / "primal_dual" / "table1.md"
    assert report.is_file() and "attnbench sweep x=1" in report.read_text()
    assert "wrote" in out and not (workdir / "results").exists()


def test_hub_dataset_without_network_is_one_line_at_once(workdir, monkeypatch):
    import time

    from bench_cli.core.errors import DataNotFoundError
    from attnbench.tasks.data import load_hf_dataset

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # an unreachable hub
    monkeypatch.setenv("HF_HOME", str(workdir / "hf"))
    started = time.perf_counter()
    with pytest.raises(DataNotFoundError) as e:
        load_hf_dataset("stanfordnlp/imdb", missing="IMDB is not available: run `attnbench data lra_text imdb`")
    assert time.perf_counter() - started < 15
    assert "\n" not in str(e.value) and "offline, and not in the HF cache" in str(e.value)


def test_a_symlinked_results_file_is_written_through_and_stays_a_link(uea_fixture, workdir):
    """results.path=link.csv -> elsewhere/target.csv: the target gets the row, the link stays a link."""
    target = workdir / "elsewhere" / "target.csv"
    main(["run", *TINY, f"results.path={target}"])
    (workdir / "link.csv").symlink_to(target)
    main(["run", *TINY, "seed=1", "results.path=link.csv"])
    assert (workdir / "link.csv").is_symlink() and (workdir / "link.csv").resolve() == target.resolve()
    assert [r["seed"] for r in read_records(target)] == ["0", "1"]


def test_report_on_a_corrupt_records_file_is_one_line_naming_the_line(workdir, capsys):
    """A damaged records file: an unterminated quote is exit 2 and one line, not rows absorbed as gaps."""
    from bench_cli.results.csv_store import append_record

    path = workdir / "runs.csv"
    for seed in range(3):
        append_record(path, {"run_id": f"r{seed}", "status": "ok", "task": "uea", "dataset": "JapaneseVowels",
                             "model": "softmax", "seed": seed, "experiment": "primal_dual/table1",
                             "test_accuracy": 98.0, "variant_key": "v", "metrics_json": {"history": [seed]}})
    lines = path.read_text().splitlines(keepends=True)
    lines[2] = lines[2].replace("r1,", '"r1,', 1)
    path.write_text("".join(lines))
    err = exit_line(capsys, "report", "primal_dual/table1", f"--records={path}")
    assert f"{path} line 3" in err and "corrupt" in err


def test_a_run_refuses_a_records_file_with_rows_wider_than_its_header(uea_fixture, workdir, capsys):
    """A damaged records file is refused before training (no work lost), one line naming the file and the row."""
    from bench_cli.results.csv_store import append_record

    path = workdir / "res.csv"
    append_record(path, {"run_id": "r0", "status": "ok"})
    text = path.read_text() + path.read_text().splitlines()[1] + ",from,a,newer,version\n"
    path.write_text(text)
    err = exit_line(capsys, "run", *TINY, f"results.path={path}")
    assert f"{path} line 3" in err and not list((workdir / "outputs").glob("runs/*/*"))
    assert path.read_text() == text


def test_dry_run_lists_every_job_and_marks_missing_data(workdir, capsys):
    """A plan needs no data: a dry run lists an experiment's jobs without their data (MNIST and CIFAR-100 are
    not in the test's data root), marked; a real sweep refuses them in one line."""
    from bench_cli.commands.cli import main

    args = ["sweep", "experiment=pay_better_attention/table1", "seed=0", "model=standard,super"]
    main([*args, "--dry-run"])
    out = capsys.readouterr().out
    assert "4 jobs, 0 already done, 4 to run" in out and out.count("data missing") == 4 + 1
    assert "vit/mnist standard seed=0" in out and "attnbench data vision mnist" in out
    assert "MNIST not found" in exit_line(capsys, *args)


# --- attentions that misbehave (a plugin's bug is its own clear line, not the harness's traceback) -----
@pytest.fixture
def broken_attentions():
    """Two registered attentions that misbehave: 'boomatt' raises in its kernel, 'narrowatt'
    returns (B, H, 1, d) (one query's output), which would broadcast in the residual sum."""
    from attnbench.models.attention import ATTENTIONS, Capabilities, ProjectedAttention, register_attention

    with ATTENTIONS.restoring():
        caps = Capabilities(causal=False, padding_mask=True)

        @register_attention("boomatt", paper="-", equation="-", capabilities=caps)
        class Boom(ProjectedAttention):
            def kernel(self, q, k, v, mask, causal):
                raise RuntimeError("boom in kernel")

        @register_attention("narrowatt", paper="-", equation="-", capabilities=caps)
        class Narrow(ProjectedAttention):
            def kernel(self, q, k, v, mask, causal):
                return v[:, :, :1, :]

        yield


@pytest.mark.usefixtures("broken_attentions")
@pytest.mark.parametrize("attention, error", [
    ("narrowatt", "AttentionShapeError: attention 'narrowatt' returned shape (8, 1, 16), expected (8, 9, 16)"),
    ("boomatt", "RuntimeError: boom in kernel"),
])
def test_an_attention_that_fails_when_it_runs_is_a_failed_row(uea_fixture, workdir, capsys, attention, error):
    """Cases 2 and 3: `run` records a failed row with error.txt (no traceback); `validate` is one line."""
    with pytest.raises(SystemExit) as e:
        main(["run", *TINY, f"model.attention.name={attention}", "results.path=res.csv"])
    assert e.value.code == 1
    out = capsys.readouterr()
    assert "Traceback" not in out.err + out.out and f"run failed: {error.split(' (')[0].split(', expected')[0]}" in out.out
    (row,) = read_records(workdir / "res.csv")
    assert row["status"] == "failed" and row["error"].startswith(error)
    assert (Path(row["output_dir"]) / "error.txt").is_file()
    err = exit_line(capsys, "validate", *TINY, f"model.attention.name={attention}")
    assert "fails on a synthetic batch" in err and error.split(" (8")[0] in err


def test_a_sweep_checks_each_attention_of_one_model_name(uea_fixture, workdir, capsys):
    """model.attention.name=a,b are two models of one name: each is validated, not only the first."""
    err = exit_line(capsys, "sweep", *TINY, "model.attention.name=softmax,nosuch", "--dry-run")
    assert "unknown attention 'nosuch'" in err


# --- every file written atomically, every cache read validated (a kill or a bad cache loses no work) ------
def test_every_file_is_written_through_the_one_atomic_writer():
    """No module of bench_cli, tasks or models writes a file in place: a kill mid-write would
    leave it empty or partial (bench_cli.core.files is the one writer)."""
    import re

    root = Path(__file__).resolve().parents[1]
    in_place = re.compile(r"\.write_text\(|\.write_bytes\(|\bopen\([^)]*['\"][wa]b?['\"]|\.savefig\((?!f,)|"
                          r"OmegaConf\.save\(|torch\.save\((?!\{|state, f\))|json\.dump\(|\.to_csv\(|shutil\.(copy2?|copyfile|move)\(")
    allowed = {"bench_cli/core/files.py", "bench_cli/results/csv_store.py:lock", "bench_cli/commands/profile/harness.py:/proc", "bench_cli/commands/profile/steps.py:/proc",
               "tasks/lra/listops_generator.py:part", "tasks/data.py:part"}  # .part files renamed whole
    found = []
    for source in [*root.glob("bench_cli/**/*.py"), *root.glob("tasks/**/*.py"), *root.glob("models/**/*.py")]:
        rel = str(source.relative_to(root))
        for n, line in enumerate(source.read_text().splitlines(), 1):
            if in_place.search(line) and not line.lstrip().startswith(("#", '"""')) and rel not in allowed \
                    and not any(rel == a.split(":")[0] and a.split(":")[1] in line for a in allowed if ":" in a):
                found.append(f"{rel}:{n}: {line.strip()}")
    assert not found, "\n".join(found)


def test_an_atomic_write_that_fails_leaves_the_old_file(tmp_path):
    from bench_cli.core.files import atomic_open, write_atomically

    path = tmp_path / "report.md"
    write_atomically(path, "old\n")
    with pytest.raises(RuntimeError):
        with atomic_open(path, "w") as f:
            f.write("half of the new")
            raise RuntimeError("killed")
    assert path.read_text() == "old\n" and [p.name for p in tmp_path.iterdir()] == ["report.md"]


def test_a_cache_entry_of_another_shape_is_a_miss_rebuilt_with_a_warning(uea_fixture, workdir, capsys, monkeypatch):
    import torch

    from bench_cli.core import errors
    from attnbench.tasks.timeseries import read_ts_cached

    source = uea_fixture / "Fixture_TRAIN.ts"
    series, labels = read_ts_cached(source, workdir / "data")
    (entry,) = (workdir / "data" / "ts_cache").glob("*.pt")
    for foreign in ({"values": [1, 2], "lengths": "x", "labels": "x", "numeric": False}, [1, 2, 3]):
        monkeypatch.setattr(errors, "_WARNED", set())  # each foreign entry says so (once per process)
        torch.save(foreign, entry)
        again, labels_again = read_ts_cached(source, workdir / "data")
        assert len(again) == len(series) and all((a == b)[~np.isnan(a)].all() for a, b in zip(again, series))
        assert list(labels_again) == list(labels)
        assert f"warning: cache {entry} is not an entry of this key" in capsys.readouterr().err


def test_a_read_only_cache_is_said_once_and_the_run_trains_from_the_source(uea_fixture, workdir, capsys, monkeypatch):
    """Case 8: the cache is an optimisation; a read-only data root still runs."""
    import attnbench.tasks.data as task_data

    def read_only(path, mode="w", **kw):
        raise OSError(errno.EROFS, "Read-only file system", str(path))

    monkeypatch.setattr(task_data, "atomic_open", read_only)
    main(["run", *TINY, "results.path=res.csv"])
    (row,) = read_records(workdir / "res.csv")
    assert row["status"] == "ok"
    err = capsys.readouterr().err
    assert err.count("cannot write the cache in") == 1 and "Read-only file system" in err


def test_a_measurement_cache_entry_of_another_shape_is_measured_again(uea_fixture, workdir, capsys, monkeypatch):
    from bench_cli.core import errors

    run = [*TINY, "measure.flops=true", "results.path=res.csv"]
    main(["run", *run])
    (entry,) = (workdir / ".measure_cache").glob("*.json")
    first = read_records(workdir / "res.csv")[0]
    for foreign in (json.dumps({**json.loads(entry.read_text()), "params": 3}),):  # another model's
        entry.write_text(foreign)
        monkeypatch.setattr(errors, "_WARNED", set())
        main(["run", *run])
        err = capsys.readouterr().err
        assert f"warning: measurement cache .measure_cache/{entry.name} is not an entry for this model" in err
        last = read_records(workdir / "res.csv")[-1]
        assert last["status"] == "ok" and (last["params"], last["flops_train_step"]) == (first["params"], first["flops_train_step"])


# --- paths the user gave (unusable ones are one line before anything runs) --------------------------------
def test_an_unusable_output_folder_is_one_line_before_anything_runs(uea_fixture, workdir, capsys):
    (workdir / "afile").write_text("x")
    for command in ("validate", "run"):
        err = exit_line(capsys, command, *TINY, f"paths.output_dir={workdir / 'afile' / 'out'}", "results.path=res.csv")
        assert f"paths.output_dir={workdir / 'afile' / 'out'}: cannot write in {workdir / 'afile'}" in err
    assert not (workdir / "res.csv").exists()


def test_os_errors_on_paths_the_user_gave_are_one_line_naming_the_path(uea_fixture, workdir, capsys, monkeypatch):
    """report --out under a file, a name too long, `data` into a root it cannot write."""
    from bench_cli.results.csv_store import append_record

    (workdir / "afile").write_text("x")
    append_record(workdir / "runs.csv", {"run_id": "r0", "status": "ok", "task": "uea", "dataset": "Fixture",
                                         "model": "softmax", "seed": 0, "test_accuracy": 90.0})
    err = exit_line(capsys, "report", "--records", "runs.csv", "--out", str(workdir / "afile" / "rep"))
    assert f"{workdir / 'afile' / 'rep'}: Not a directory (a part of the path is a file" in err
    err = exit_line(capsys, "report", "--records", "runs.csv", "--out", "x" * 300)
    assert "File name too long (the name is too long: choose a shorter path)" in err
    err = exit_line(capsys, "data", "uea", "JapaneseVowels", f"paths.data_root={workdir / 'afile'}")
    assert f"{workdir / 'afile'}" in err and "Not a directory" in err
    import attnbench.tasks.timeseries as timeseries

    def read_only(path, data, **kw):
        raise OSError(errno.EROFS, "Read-only file system", str(path))

    monkeypatch.setattr(timeseries, "write_atomically", read_only)
    err = exit_line(capsys, "data", "uea", "JapaneseVowels", f"paths.data_root={workdir / 'ro'}")
    assert f"{workdir / 'ro' / 'uea' / 'JapaneseVowels'}" in err and "a read-only file system" in err


def test_a_sweep_labels_each_job_with_every_swept_value(uea_fixture, workdir, capsys):
    """Case 12: model.attention.name=a,b inside one model: the labels differ."""
    main(["sweep", *TINY, "model.attention.name=softmax,linear", "seed=0,1", "--dry-run"])
    out = capsys.readouterr().out
    for attention in ("softmax", "linear"):
        for seed in (0, 1):
            assert f"uea/Fixture softmax seed={seed} model.attention.name={attention}" in out
    assert "trainer.max_epochs" not in out  # what every job shares is not repeated


def test_sigquit_during_a_run_records_an_interrupted_row(uea_fixture, workdir, capsys, monkeypatch):
    """Case 14: Ctrl-\\ is handled like SIGTERM: a row, then exit 128 + 3."""
    import signal

    from bench_cli.engine.trainer import Trainer

    def quit_signal(self, protocol):
        os.kill(os.getpid(), signal.SIGQUIT)

    previous = signal.getsignal(signal.SIGQUIT)
    monkeypatch.setattr(Trainer, "fit", quit_signal)
    try:
        err = exit_line(capsys, "run", *TINY, "results.path=res.csv", code=128 + signal.SIGQUIT)
    finally:
        signal.signal(signal.SIGQUIT, previous)
    assert "interrupted (SIGQUIT)" in err
    (row,) = read_records(workdir / "res.csv")
    assert row["status"] == "interrupted"


@pytest.mark.parametrize("seed", ["-1", str(2**32), str(2**70)])
def test_a_seed_numpy_cannot_take_is_refused(uea_fixture, workdir, capsys, seed):
    """Case 11: NumPy's RandomState takes 0 .. 2**32 - 1."""
    err = exit_line(capsys, "validate", *TINY, f"seed={seed}")
    assert f"bad value for seed: {seed} (expected an integer between 0 and 4294967295)" in err


# --- files that cannot be trusted (BOMs, damaged caches: read alike or refused in one line) ----------------
def test_a_records_file_with_a_byte_order_mark_is_read_and_kept_alike(uea_fixture, workdir, capsys):
    """Case 5: `run` and `report` read a BOM alike (a spreadsheet's export); the BOM stays."""
    from bench_cli.results.csv_store import BOM, append_record

    path = workdir / "res.csv"
    append_record(path, {"run_id": "r0", "status": "ok", "task": "uea", "dataset": "Fixture", "model": "softmax",
                         "seed": 0, "test_accuracy": 90.0})
    path.write_text(BOM + path.read_text(encoding="utf-8"), encoding="utf-8")
    main(["run", *TINY, "seed=1", f"results.path={path}"])
    assert path.read_text(encoding="utf-8").startswith(BOM + "run_id,")
    assert [r["run_id"] for r in read_records(path)][0] == "r0" and len(read_records(path)) == 2
    main(["report", "--records", str(path), "--no-write"])
    assert "r0" not in capsys.readouterr().err


FORMULAS = {"dataset": "=1+2", "model": "@SUM(1+1)*cmd|' /C calc'!A0", "attention": "+cmd", "error": "\tx",
            "experiment": "-flag", "git_commit": "'quoted"}


def test_cells_that_would_run_as_formulas_are_escaped_and_read_back(workdir):
    """Case 6: a leading apostrophe (a spreadsheet shows the text); read_records strips it, so
    every value reads back as written; numbers, negative ones too, stay numbers."""
    import csv

    from bench_cli.results.csv_store import append_record

    path = workdir / "runs.csv"
    append_record(path, {"run_id": "r0", "status": "ok", "seed": -1, "test_score": -0.5, "test_loss": float("-inf"),
                         **FORMULAS})
    (raw,) = csv.DictReader(path.open(newline=""))
    assert {k: raw[k] for k in FORMULAS} == {k: "'" + v for k, v in FORMULAS.items()}
    assert (raw["seed"], raw["test_score"], raw["test_loss"]) == ("-1", "-0.5", "-inf")
    (row,) = read_records(path)
    assert {k: row[k] for k in FORMULAS} == FORMULAS and row["test_score"] == "-0.5"


def test_a_report_csv_escapes_formulas_too(workdir, capsys):
    import csv

    from bench_cli.results.csv_store import append_record

    path = workdir / "runs.csv"
    for seed, dataset in enumerate(("=1+2", "@SUM(1+1)")):  # two datasets: a column of the report
        append_record(path, {"run_id": f"r{seed}", "status": "ok", "task": "uea", "dataset": dataset,
                             "model": "softmax", "seed": seed, "test_accuracy": 90.0 + seed})
    main(["report", "--records", str(path)])
    cells = [c for r in csv.reader(open(workdir / "reproduced" / "runs.csv", newline="")) for c in r]
    assert not [c for c in cells if c.startswith(("=", "@"))] and any(c.startswith("'=") or c.startswith("'@")
                                                                       for c in cells)


@pytest.mark.parametrize("name", [[], ["primal_dual/table1"]])
def test_a_report_over_nan_or_inf_scores_shows_them_and_leaves_them_out_of_means(workdir, capsys, name):
    """Case 9: no traceback from statistics; such a seed is named in a note, the mean is of the rest."""
    from bench_cli.results.csv_store import append_record

    path = workdir / "runs.csv"
    for seed, score in enumerate((98.0, float("nan"), float("inf"), 96.0)):
        append_record(path, {"run_id": f"r{seed}", "status": "ok", "task": "uea", "dataset": "JapaneseVowels",
                             "model": "softmax", "seed": seed, "experiment": "primal_dual/table1",
                             "test_accuracy": score, "test_score": score, "variant_key": "v"})
    main(["report", *name, "--records", str(path), "--width", "400"])
    out = capsys.readouterr().out
    assert "Left out of the means, as failed seeds: ok records whose value is not finite: " in out
    import re

    assert re.search(r"seed 1 \(test_\w+ nan\)", out) and re.search(r"seed 2 \(test_\w+ inf\)", out)
    assert "97.0" in out  # the mean of 98 and 96


@pytest.mark.parametrize("damage", ['{"num_train": 4', "[1, 2]"])
def test_a_damaged_generator_json_is_one_line_naming_it_and_ls_says_damaged(workdir, capsys, damage):
    """Case 7: a cut or non-object generator.json of the generated ListOps set."""
    from attnbench.tasks.lra import listops_generator

    folder = workdir / "data" / "lra_generated" / "listops-1000"
    listops_generator.write_dataset(folder, num_train=8, num_val=2, num_test=2, seed=0, max_depth=3, max_args=3, min_length=5,
                    max_length=30)
    (folder / "generator.json").write_text(damage)
    run = ["task=lra_listops", "task.dataset=listops_generated", "task.max_len=32", "task.seq_len=32"]
    for args in (["validate", *run], ["validate", *run, "+task.generator.seed=0"],
                 ["data", "lra_listops", "--generate", "--num-train=8"]):
        err = exit_line(capsys, *args)
        assert f"{folder / 'generator.json'} is damaged" in err and "--force" in err, err
    main(["ls", "datasets"])
    out = capsys.readouterr().out
    assert "listops_generated  damaged" in out and "damaged: fetch it again with --force" in out.replace("\n", " ")


# --- sizes checked before anything is allocated (a bad size is one line, not an out-of-memory kill) -------
@pytest.mark.parametrize("args, expected", [
    (["bench", "--seq-lens", "0"], "option --seq-lens of `attnbench bench` must be an integer of at least 1 (got 0)"),
    (["bench", "--seq-lens", "-1"], "option --seq-lens of `attnbench bench` must be an integer of at least 1 (got -1)"),
    (["bench", "--seq-lens", "1000000000"], "`attnbench bench` at N=1000000000 (batch 1, 2 heads) needs at least"),
    (["bench", "--batch", "0"], "option --batch of `attnbench bench` must be an integer of at least 1 (got 0)"),
    (["bench", "--heads", "3"], "--heads 3 does not divide --d-model 64"),
    (["bench", "--repeats", "0"], "option --repeats of `attnbench bench` must be an integer of at least 1 (got 0)"),
    (["bench", "--variants", "nosuch"], "unknown variant 'nosuch'"),
    (["check-attention", "softmax", "--length", "100000000"], "check-attention softmax at --length 100000000"),
    (["check-attention", "softmax", "--heads", "3"], "--heads 3 does not divide --d-model 16"),
    (["data", "lra_listops", "--generate", "--num-train=-1"], "option num_train must be an integer at least 1, got -1"),
    (["data", "lra_listops", "--generate", "--num-train=100000000000"], "a generated ListOps set of these sizes needs"),
    (["data", "lra_listops", "--generate", "--min-length=50", "--max-length=10"], "--min-length=50 is above"),
])
def test_sizes_that_cannot_be_are_one_line_before_anything_is_allocated(workdir, capsys, args, expected):
    assert expected in exit_line(capsys, *args)


@pytest.mark.parametrize("override, expected", [
    ("task.backbone.d_model=0", "bad value for task.backbone.d_model: 0 (expected an integer of at least 1)"),
    ("task.backbone.n_heads=3", "task.backbone.n_heads=3 does not divide task.backbone.d_model=16"),
    ("task.backbone.n_layers=-1", "bad value for task.backbone.n_layers: -1"),
    ("task.max_len=0", "bad value for task.max_len: 0"),
    ("task.max_len=1000000000", "does not fit in memory at these sizes"),
])
def test_run_sizes_that_cannot_be_are_refused_not_recorded(uea_fixture, workdir, capsys, override, expected):
    assert expected in exit_line(capsys, "run", *TINY, override, "results.path=res.csv")
    assert not (workdir / "res.csv").exists()


# --- Hydra's override syntaxes: one reading in run, validate and sweep (so a plan is what runs) -------------
@pytest.mark.parametrize("override, sweep_jobs", [
    ("seed=choice(0,1)", ["softmax seed=0", "softmax seed=1"]),
    ("seed=range(0,3,step=2)", ["softmax seed=0", "softmax seed=2"]),
    ("model=glob(attention_b*)", ["attention_bn seed=0", "attention_bn_sh seed=0"]),
    ("seed=0,1", ["softmax seed=0", "softmax seed=1"]),
])
def test_sweep_syntaxes_are_sweeps_alone(uea_fixture, workdir, capsys, override, sweep_jobs):
    for command in ("validate", "run"):
        assert f"'{override}' is a sweep (comma list, choice, range, glob); use `attnbench sweep`" in \
            exit_line(capsys, command, *TINY, override)
    main(["sweep", *TINY, override, "--dry-run"])
    out = capsys.readouterr().out
    assert f"{len(sweep_jobs)} jobs" in out and all(f"uea/Fixture {job}" in out for job in sweep_jobs)


@pytest.mark.parametrize("override, expected", [
    ("trainer.optimizer.lr=interval(0.001,0.01)", "interval() is for search sweepers (Optuna): `attnbench sweep hydra/sweeper=optuna"),
    ("task.dataset=glob(F*)", "glob() selects options of a config group"),
    ("model=glob(zz*)", "'model=glob(zz*)' matches no model; model options: "),
    ("model=glob(*,exclude=[a*])", "is a sweep"),  # the brackets shown as typed, not taken for markup
])
def test_syntaxes_no_command_takes_are_one_line_in_every_command(uea_fixture, workdir, capsys, override, expected):
    commands = {"model=glob(zz*)": [["sweep", "--dry-run"]], "model=glob(*,exclude=[a*])": [["validate"]]}.get(
        override, [["validate"], ["run"], ["sweep", "--dry-run"]])
    for command in commands:
        err = exit_line(capsys, *command, *TINY, override)
        assert expected in err and (override in err or "matches no" in err), err


def test_quoted_values_read_alike_in_run_validate_and_sweep(uea_fixture, workdir, capsys):
    main(["validate", *TINY, "task.dataset='Fixture'"])
    assert "ok: uea/Fixture" in capsys.readouterr().out
    main(["sweep", *TINY, 'task.dataset="Fixture"', "--dry-run"])
    assert "uea/Fixture softmax seed=0" in capsys.readouterr().out
