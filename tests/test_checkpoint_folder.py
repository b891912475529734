"""What else a job's checkpoint folder may hold never costs the job its checkpoints or its resume:
files it cannot use (cut short, of another job, not a checkpoint at all, a folder, garbage) with
higher numbers than its own are passed over, its own checkpoints are numbered above them, pruning
and the final clean-up remove only its own, the temporary files of killed writes are removed (not
a write in progress), every message about resuming says what the next sitting does, and a root
where checkpoints cannot be written is refused before the run trains."""
from __future__ import annotations

import fcntl
import os
import signal
import time
from pathlib import Path

import pytest
import torch

from bench_cli.commands.cli import main
from bench_cli.engine import checkpoint
from bench_cli.results.csv_store import read_records
from test_checkpoint import UEA, interrupt_at, run

SETTINGS = checkpoint.Settings(every=0, keep=1, keep_final=False, resume="true")
PARTS = {k: {} for k in checkpoint.PARTS if k not in ("job_key", "meta", "sittings", "wall_time_s")}


def checkpoints(folder: Path, job_key: str = "mine", settings: checkpoint.Settings = SETTINGS) -> checkpoint.Checkpoints:
    return checkpoint.Checkpoints(folder, settings, job_key, {}, 0.0)


def unusable_files(folder: Path) -> dict[str, bytes | None]:
    """Files the job cannot use, numbered above anything it will have written; {name: bytes, None: a folder}."""
    folder.mkdir(parents=True, exist_ok=True)
    checkpoints(folder / "elsewhere", "another job").save({**PARTS, "position": {"step": 9}})
    foreign = next((folder / "elsewhere").glob("ckpt-*.pt")).read_bytes()
    made = {"ckpt-000050.pt": foreign[:1000], "ckpt-000060.pt": foreign, "ckpt-000070.pt": b"\x00garbage\xff" * 10,
            "ckpt-000080.pt": None, "ckpt-x.pt": b"not numbered"}
    for name, data in made.items():
        if data is None:
            (folder / name).mkdir()
        else:
            (folder / name).write_bytes(data)
    (folder / "elsewhere" / next((folder / "elsewhere").glob("ckpt-*.pt")).name).unlink()
    (folder / "elsewhere").rmdir()
    return made


def assert_untouched(folder: Path, made: dict) -> None:
    for name, data in made.items():
        assert (folder / name).is_dir() if data is None else (folder / name).read_bytes() == data, name


def test_files_the_job_cannot_use_never_cost_it_its_checkpoints(workdir, capsys):
    folder = workdir / "ck"
    made = unusable_files(folder)
    first = checkpoints(folder)
    assert first.load() is None
    err = capsys.readouterr().err
    for name in ("ckpt-000050.pt", "ckpt-000060.pt", "ckpt-000070.pt", "ckpt-000080.pt"):
        assert f"checkpoint {folder / name} " in err
    assert "starting over from the beginning" in err and "Traceback" not in err
    saved = [first.save({**PARTS, "position": {"step": step}}) for step in (1, 2)]
    assert [p.name for p in saved] == ["ckpt-000081.pt", "ckpt-000082.pt"]  # above every file there
    assert not saved[0].exists() and saved[1].is_file()  # keep 1: its own older one pruned, nothing else
    assert_untouched(folder, made)
    assert first.columns()["checkpoint_bytes"] == saved[1].stat().st_size  # its own, not the others'

    second = checkpoints(folder)
    state = second.load()
    assert state is not None and state["position"] == {"step": 2} and second.resumed_from == str(saved[1])
    assert "resuming from" in capsys.readouterr().err
    assert second.save({**PARTS, "position": {"step": 3}}).name == "ckpt-000083.pt" and not saved[1].exists()
    assert checkpoint.resumable_from_folder(folder, "mine") == folder / "ckpt-000083.pt"
    second.finish("ok")  # its own removed; the rest is left, said in one line
    assert not list(folder.glob("ckpt-00008[1-3].pt"))
    assert_untouched(folder, made)
    assert f"left in {folder}: " in capsys.readouterr().err


def test_resume_false_never_prunes_its_new_checkpoint_for_an_older_run(workdir):
    folder = workdir / "ck"
    checkpoints(folder).save({**PARTS, "position": {"step": 7}})
    later = checkpoints(folder)
    later.sequence = 40  # an earlier sitting that got further: a higher number than a new sitting starts at
    later.save({**PARTS, "position": {"step": 40}})
    again = checkpoints(folder, settings=checkpoint.Settings(every=0, keep=1, keep_final=False, resume="false"))
    assert again.load() is None
    path = again.save({**PARTS, "position": {"step": 1}})
    assert [p.name for p in folder.iterdir()] == [path.name] and path.name == "ckpt-000042.pt"


def test_a_killed_writes_temporary_file_is_removed_and_a_write_in_progress_is_not(workdir, capsys):
    folder = workdir / "ck"
    folder.mkdir()
    stale, live, young = (folder / "ckpt-000002.ptabc123.tmp", folder / "ckpt-000003.ptdef456.tmp",
                          folder / "ckpt-000004.ptghi789.tmp")
    for path in (stale, live, young):
        path.write_bytes(b"PK\x03\x04 half a zip")
    old = time.time() - 3600
    for path in (stale, live):
        os.utime(path, (old, old))
    with open(live, "rb") as writer:  # another process's write in progress holds the lock (atomic_open)
        fcntl.flock(writer.fileno(), fcntl.LOCK_EX)
        ck = checkpoints(folder)
        assert ck.load() is None
        assert not stale.exists() and live.exists() and young.exists()
    assert f"removed {stale}: a checkpoint write that was killed midway" in capsys.readouterr().err
    foreign = folder / "notes.pt.tmp"  # not a checkpoint's temporary file: never ours to remove
    foreign.write_bytes(b"x")
    os.utime(foreign, (old, old))
    ck.save({**PARTS, "position": {"step": 1}})
    ck.finish("ok")
    assert foreign.exists() and not live.exists()  # its writer let go: a leftover now


def test_a_kill_during_a_write_leaves_a_locked_temporary_file_until_its_writer_dies(workdir):
    """The lock atomic_open holds is what tells a write in progress from a killed one's leftover."""
    from bench_cli.core.files import atomic_open, remove_stale_temporaries

    folder = workdir / "ck"
    folder.mkdir()
    with atomic_open(folder / "ckpt-000001.pt", "wb") as f:
        f.write(b"part")
        (tmp,) = folder.glob("*.tmp")
        os.utime(tmp, (time.time() - 3600,) * 2)
        assert remove_stale_temporaries(folder, checkpoint.TEMPORARY) == [] and tmp.exists()
    assert not tmp.exists() and (folder / "ckpt-000001.pt").read_bytes() == b"part"


def test_an_unusable_higher_numbered_file_and_interruptions_resume_the_job(uea_fixture, workdir, monkeypatch, capsys):
    """The case as a user meets it: a truncated ckpt-000050.pt in the job's folder, the run
    interrupted twice; each message promises the resume the next sitting makes, and the job ends
    in its third sitting (that it ends with the uninterrupted record: test_checkpoint)."""
    for step in (3, 6):
        with monkeypatch.context() as m:
            interrupt_at(m, step, "SIGTERM")
            with pytest.raises(SystemExit) as e:
                main(["run", *UEA, "results.path=res.csv"])
        assert e.value.code == 128 + signal.SIGTERM
        folder = Path(read_records("res.csv")[-1]["checkpoint_dir"])
        newest = max(folder.glob("ckpt-*.pt"))
        assert f"the same command resumes from its checkpoint {newest}" in capsys.readouterr().err
        if step == 3:
            (folder / "ckpt-000050.pt").write_bytes(newest.read_bytes()[:1000])
        else:
            assert newest.name > "ckpt-000050.pt"
    run(*UEA, "results.path=res.csv")
    assert f"resuming from {newest}" in capsys.readouterr().err
    resumed = read_records("res.csv")[-1]
    assert resumed["status"] == "ok" and resumed["sittings"] == "3" and resumed["resumed_from"] == str(newest)
    assert [p.name for p in folder.iterdir()] == ["ckpt-000050.pt"]  # only the file it could not use is left


def test_an_interruption_before_any_checkpoint_says_the_command_starts_over(uea_fixture, workdir, monkeypatch, capsys):
    with monkeypatch.context() as m:
        interrupt_at(m, 1, "SIGTERM")
        monkeypatch.setattr(checkpoint.Checkpoints, "save", lambda self, state: None)  # nothing reaches the folder
        with pytest.raises(SystemExit):
            main(["run", *UEA, "results.path=res.csv"])
    err = capsys.readouterr().err
    assert "no checkpoint was written: the same command starts over" in err and "resumes from" not in err


@pytest.mark.parametrize("root", ["/proc/attnbench-checkpoints", "a-file/checkpoints"])
def test_a_root_where_checkpoints_cannot_be_written_is_refused_before_training(uea_fixture, workdir, capsys, root):
    Path("a-file").write_text("not a folder")
    with pytest.raises(SystemExit) as e:
        main(["run", *UEA, "results.path=res.csv", f"trainer.checkpoint.root={root}"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "trainer.checkpoint.root: cannot write checkpoints in " in err and len(err.strip().splitlines()) == 1
    assert read_records("res.csv") == []  # refused before the run: no record, nothing trained


def test_a_failed_runs_summary_never_says_its_checkpoints_were_removed(workdir, capsys):
    from bench_cli.core.ui import print_summary

    row = {"run_id": "r", "status": "failed", "task": "t", "dataset": "d", "model": "m", "attention": "a",
           "seed": 0, "protocol": "holdout", "checkpoint_dir": str(workdir / "never-made"), "checkpoint_bytes": 0}
    print_summary(row, "res.csv")
    out = capsys.readouterr().out
    assert "checkpoints (none written)" in out and "removed" not in out
    print_summary({**row, "status": "ok", "checkpoint_bytes": 2048}, "res.csv")
    assert "removed, the run is ok" in capsys.readouterr().out


def test_a_checkpoint_of_a_wrong_shape_is_one_line(workdir):
    folder = workdir / "ck"
    folder.mkdir()
    for name, state in (("ckpt-000001.pt", [1, 2]), ("ckpt-000002.pt", {"format": 1, "meta": [], "position": 3})):
        torch.save(state, folder / name)
    with pytest.raises(checkpoint.CheckpointError, match="not an attnbench checkpoint"):
        checkpoint.read(folder / "ckpt-000001.pt")
    with pytest.raises(checkpoint.CheckpointError, match="lacks"):
        checkpoint.read(folder / "ckpt-000002.pt")
    assert checkpoint.resumable_from_folder(folder, "mine") is None
