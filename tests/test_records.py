"""Provenance: a record is dirty when code or configs differ from the commit, not when a report
under results/ was rewritten."""
from __future__ import annotations

import subprocess

from bench_cli.records import git_state


def test_dirty_ignores_generated_results_but_not_code(tmp_path):
    def git(*args):
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=tmp_path, check=True,
                       capture_output=True)

    (tmp_path / "results").mkdir()
    (tmp_path / "code.py").write_text("x = 1\n")
    (tmp_path / "results" / "table.md").write_text("| a |\n")
    git("init", "-q")
    git("add", ".")
    git("commit", "-qm", "init")
    commit, dirty = git_state(tmp_path)
    assert len(commit) == 40 and dirty == "false"
    (tmp_path / "results" / "table.md").write_text("| b |\n")
    assert git_state(tmp_path)[1] == "false"
    (tmp_path / "code.py").write_text("x = 2\n")
    assert git_state(tmp_path)[1] == "true"


def test_outside_git_is_unknown(tmp_path):
    assert git_state(tmp_path) == ("unknown", "")


def test_job_keys_survive_added_config_keys():
    """Records written before a config key existed still count as done: the default run's job key
    is the one of the first release, and a key added later at its neutral value changes nothing."""
    from bench_cli.compose import compose
    from bench_cli.records import ADDED_KEYS, job_key

    cfg = compose([])
    assert job_key(cfg) == "ffc7a36c4e882a6a"  # `attnbench run` (UEA JapaneseVowels, softmax), since 6c2e6b7
    assert job_key(compose(["trainer.num_workers=0"])) == job_key(cfg)
    assert job_key(compose(["trainer.num_workers=2"])) != job_key(cfg)
    assert "trainer.num_workers" in ADDED_KEYS


def test_one_writer_for_records_and_profile_rows(tmp_path):
    """write_rows: the given columns first, unknown keys become new columns (older rows blank),
    append keeps the rows, append=False replaces them; append_record is the records' use of it."""
    import csv

    from bench_cli.records import COLUMNS, append_record, write_rows

    def read(path):
        with open(path, newline="") as f:
            return list(csv.reader(f))

    path = tmp_path / "sub" / "p.csv"
    write_rows(path, [{"b": 1, "a": 0.5}], ["a", "b"])
    write_rows(path, [{"a": None, "c": [1, 2]}], ["a", "b"])
    assert read(path) == [["a", "b", "c"], ["0.5", "1", ""], ["", "", "[1, 2]"]]
    write_rows(path, [{"b": 2}], ["a", "b"], append=False)
    assert read(path) == [["a", "b"], ["", "2"]]
    assert not list(path.parent.glob("*.tmp"))
    runs = tmp_path / "runs.csv"
    append_record(runs, {"run_id": "r1", "extra": 1})
    append_record(runs, {"run_id": "r2"})
    header, *rows = read(runs)
    assert header == [*COLUMNS, "extra"] and [r[0] for r in rows] == ["r1", "r2"] and rows[0][-1] == "1"


def test_append_keeps_the_files_mode_and_a_new_file_gets_the_umasks(tmp_path):
    """Issue 10 item 3: the atomic rewrite's temporary file (0600) must not change the CSV's mode."""
    import os
    import stat

    from bench_cli.records import append_record

    old = os.umask(0o022)
    try:
        fresh = tmp_path / "new.csv"
        append_record(fresh, {"run_id": "a"})
        assert stat.S_IMODE(fresh.stat().st_mode) == 0o644
        shared = tmp_path / "shared.csv"
        append_record(shared, {"run_id": "a"})
        shared.chmod(0o664)
        append_record(shared, {"run_id": "b"})
        assert stat.S_IMODE(shared.stat().st_mode) == 0o664
    finally:
        os.umask(old)


def test_a_held_lock_is_announced_then_the_record_is_written(tmp_path, monkeypatch, capsys):
    """Issue 10 item 6: waiting on another process's lock says so, once, then appends."""
    import fcntl
    import threading

    from bench_cli import records

    monkeypatch.setattr(records, "LOCK_NOTICE_AFTER_S", 0.1)
    path = tmp_path / "runs.csv"
    holder = open(path.with_name(path.name + ".lock"), "w")
    fcntl.flock(holder, fcntl.LOCK_EX)
    threading.Timer(0.5, lambda: (fcntl.flock(holder, fcntl.LOCK_UN), holder.close())).start()
    records.append_record(path, {"run_id": "a"})
    err = capsys.readouterr().err
    assert err.count("waiting for") == 1 and "runs.csv.lock" in err
    assert [r["run_id"] for r in records.read_records(path)] == ["a"]
