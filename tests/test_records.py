"""Provenance: a record is dirty when code or configs differ from the commit, not when a report
under results/ was rewritten."""
from __future__ import annotations

import subprocess

from bench_cli.results.provenance import git_state


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
    from bench_cli.config.compose import compose
    from bench_cli.results.job_keys import ADDED_KEYS, job_key

    cfg = compose([])
    assert job_key(cfg) == "ffc7a36c4e882a6a"  # `attnbench run` (UEA JapaneseVowels, softmax), since 6c2e6b7
    assert job_key(compose(["trainer.num_workers=0"])) == job_key(cfg)
    assert job_key(compose(["trainer.num_workers=2"])) != job_key(cfg)
    assert "trainer.num_workers" in ADDED_KEYS


def test_a_run_resolves_its_config_once_with_the_same_keys_and_config_file(tmp_path):
    """A run resolves its config once (resolving again cost time at every run): the keys of the resolved
    data are those of the config, and its config.yaml has the text ``OmegaConf.save(cfg, resolve=True)``
    writes (an experiment whose per-dataset tables are interpolations, and the default run's job key)."""
    import copy

    from omegaconf import OmegaConf

    from bench_cli.config.compose import compose
    from bench_cli.results.job_keys import config_hash, job_key, run_keys, variant_key
    from bench_cli.results.run_folder import save_resolved

    for overrides in ([], ["experiment=primal_dual/table1", "task.dataset=JapaneseVowels", "model=attention_bn",
                           "seed=3"]):
        cfg = compose(overrides)
        resolved = OmegaConf.to_container(cfg, resolve=True)
        kept = copy.deepcopy(resolved)
        assert run_keys(resolved) == (config_hash(cfg), job_key(cfg), variant_key(cfg))
        assert len(set(run_keys(resolved))) == 3 and resolved == kept  # three keys; the data left as it was
        save_resolved(resolved, tmp_path / "config.yaml")
        OmegaConf.save(cfg, tmp_path / "reference.yaml", resolve=True)
        assert (tmp_path / "config.yaml").read_text() == (tmp_path / "reference.yaml").read_text()
    assert run_keys(OmegaConf.to_container(compose([]), resolve=True))[1] == "ffc7a36c4e882a6a"


def test_one_writer_for_records_and_profile_rows(tmp_path):
    """write_rows: the given columns first, unknown keys become new columns (older rows blank),
    append keeps the rows, append=False replaces them; append_record is the records' use of it."""
    import csv

    from bench_cli.results.csv_store import append_record, write_rows

    from bench_cli.results.schema import COLUMNS

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
    """The atomic rewrite's temporary file (0600) must not change the CSV's mode (others sharing the
    file still read it)."""
    import os
    import stat

    from bench_cli.results.csv_store import append_record

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
    """Waiting on another process's lock says so, once, then appends (a silent wait looks like a hang)."""
    import fcntl
    import threading

    from bench_cli.results import csv_store

    monkeypatch.setattr(csv_store, "LOCK_NOTICE_AFTER_S", 0.1)
    path = tmp_path / "runs.csv"
    holder = open(path.with_name(path.name + ".lock"), "w")
    fcntl.flock(holder, fcntl.LOCK_EX)
    threading.Timer(0.5, lambda: (fcntl.flock(holder, fcntl.LOCK_UN), holder.close())).start()
    csv_store.append_record(path, {"run_id": "a"})
    err = capsys.readouterr().err
    assert err.count("waiting for") == 1 and "runs.csv.lock" in err
    assert [r["run_id"] for r in csv_store.read_records(path)] == ["a"]


# --- every reader reads strictly, no row is reshaped (a damaged file is refused, never silently misread) --
def records_file(path, n: int) -> str:
    """``n`` rows as runs write them (a quoted JSON field each); the file's text."""
    from bench_cli.results.csv_store import append_record

    for i in range(n):
        append_record(path, {"run_id": f"r{i}", "status": "ok", "job_key": f"k{i}", "metrics_json": {"history": [i]}})
    return path.read_text()


def test_a_corrupt_row_is_an_error_naming_the_file_and_line(tmp_path):
    """An unterminated quote on line 3 (closed by a later row's quote, or by none): never rows
    silently absorbed into one field; appending refuses too and leaves the file as it was."""
    import pytest

    from bench_cli.results.csv_store import RecordsFileError, append_record, read_records

    path = tmp_path / "runs.csv"
    lines = records_file(path, 3).splitlines(keepends=True)
    lines[2] = lines[2].replace("r1,", '"r1,', 1)
    for text in ("".join(lines), "".join(lines).replace('"{', "{").replace('}"', "}").replace('""', '"')):
        path.write_text(text)
        with pytest.raises(RecordsFileError, match=f"{path} line 3.*corrupt"):
            read_records(path)
        with pytest.raises(RecordsFileError, match="line 3"):
            append_record(path, {"run_id": "new"})
        assert path.read_text() == text


def test_a_truncated_last_row_is_kept_as_it_is_with_one_warning(tmp_path, capsys):
    from bench_cli.results.csv_store import append_record, read_records

    path = tmp_path / "runs.csv"
    cut = records_file(path, 2) + "r2,2025-01-01T00:00:00+00:00,ok,,uea,Fix"  # half-written, no newline
    path.write_text(cut)
    last = read_records(path)[-1]
    assert (last["run_id"], last["dataset"], last["model"]) == ("r2", "Fix", None)
    append_record(path, {"run_id": "r3"})
    assert path.read_text().startswith(cut + "\n")  # not padded to the header's width
    assert [r["run_id"] for r in read_records(path)] == ["r0", "r1", "r2", "r3"]
    err = capsys.readouterr().err
    assert err.count("warning") == 1 and f"{path} line 4: incomplete row" in err
    path.write_text(cut + ',"{""hist')  # cut inside a quoted field: incomplete, not corrupt
    assert read_records(path)[-1]["model"] == '{"hist'


def test_a_row_wider_than_the_header_is_never_reshaped(tmp_path):
    """A newer version's row (more fields than the header): read by its named fields, and the
    file is refused for appends (and for runs, before they train), unchanged."""
    import pytest

    from bench_cli.results.csv_store import RecordsFileError, append_record, check_results_path, read_records

    path = tmp_path / "runs.csv"
    text = records_file(path, 2)
    text += text.splitlines()[1].replace("r0,", "r9,", 1) + ",newer,columns\n"
    path.write_text(text)
    row = read_records(path)[-1]
    assert row["run_id"] == "r9" and None not in row and "newer" not in row.values()
    for refused in (lambda: append_record(path, {"run_id": "new"}), lambda: check_results_path(path)):
        with pytest.raises(RecordsFileError, match=f"{path} line 4: the row has more fields than the header"):
            refused()
    assert path.read_text() == text


def test_each_job_counts_with_its_latest_ok_row(tmp_path):
    """A sweep's resume, a claim and every report take a job's latest ok row; a report keeps every
    other row and says how many ok rows of a counted job it dropped."""
    from bench_cli.results.csv_store import append_record, read_records
    from bench_cli.results.job_records import latest_ok_per_job, one_row_per_job

    path = tmp_path / "runs.csv"
    for run_id, status, key in (("a", "ok", "k1"), ("b", "failed", "k2"), ("c", "ok", "k1"), ("d", "ok", "k2"),
                                ("e", "ok", "k3"), ("f", "ok", "k1"), ("g", "failed", "k4")):
        append_record(path, {"run_id": run_id, "status": status, "job_key": key})
    rows = read_records(path)
    assert {k: r["run_id"] for k, r in latest_ok_per_job(rows).items()} == {"k1": "f", "k2": "d", "k3": "e"}
    kept, dropped = one_row_per_job(rows)
    assert [r["run_id"] for r in kept] == ["b", "d", "e", "f", "g"] and dropped == 2
