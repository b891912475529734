"""Records keyed to the code that made them (bench_cli/results/code_identity.py): every record holds
a hash of its plugin's source (and of its attention's and task's modules); a sweep runs again a job
whose plugin changed since its record, and a report refuses to average one model's records made
by different code unless told to (--mixed-code). The plugin is the manual's (tests/test_plugins.py)."""
from __future__ import annotations

import json
import sys

import pytest

from bench_cli.commands.cli import main
from bench_cli.config import plugins
from bench_cli.results import code_identity
from bench_cli.results.csv_store import read_records
from test_plugins import isolated, plugin_dir  # noqa: F401  (fixtures)
from test_sweep import sweep, tiny


def edit_plugin(folder, old: str, new: str) -> None:
    """Change the plugin's source and forget it, so the next command imports the new code
    (as a new process would)."""
    from attnbench.models.attention import registry

    path = folder / "mymod.py"
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new))
    sys.modules.pop("mymod", None)
    plugins._LOADED.pop("mymod", None)
    registry.ATTENTIONS.forget("elu_linear")


@pytest.mark.usefixtures("uea_fixture")
def test_a_changed_plugin_makes_its_job_to_run_again(isolated, workdir, capsys, monkeypatch):  # noqa: F811
    monkeypatch.setenv(plugins.PLUGINS_ENV, "")  # the sweep names its plugins there: gone after the test
    grid = [*tiny(workdir), "trainer.max_epochs=1", "plugins=[mymod]", "model.attention.name=elu_linear", "seed=0"]
    assert sweep(*grid) == 0
    (row,) = read_records(workdir / "res.csv")
    hashes = json.loads(row["code_hashes"])
    assert hashes["mymod"] == code_identity.module_digest("mymod")
    assert "attnbench.tasks.uea" in hashes  # the task's module too
    capsys.readouterr()

    assert sweep(*grid, "--dry-run") == 0  # unchanged: done
    assert "to run: plugin" not in capsys.readouterr().out

    edit_plugin(isolated, "F.elu(q) + 1, F.elu(k) + 1", "F.relu(q) + 1e-3, F.relu(k) + 1e-3")
    assert sweep(*grid, "--dry-run") == 0
    out = capsys.readouterr().out
    assert "0 already done, 1 to run" in out and "to run: plugin changed since the record: mymod" in out

    assert sweep(*grid) == 0  # claimed and run, though an ok record of its job_key is in the file
    old, new = read_records(workdir / "res.csv")
    assert new["status"] == "ok" and json.loads(new["code_hashes"])["mymod"] == code_identity.module_digest("mymod")
    assert new["code_hashes"] != old["code_hashes"] and new["test_loss"] != old["test_loss"]


def record(seed: int, plugin_hash: str) -> dict:
    return {"run_id": f"r{seed}", "time": f"2026-01-0{seed + 1}", "status": "ok", "error": "", "task": "uea",
            "dataset": "Fixture", "model": "elu_linear", "seed": seed, "protocol": "holdout", "job_key": f"j{seed}",
            "variant_key": "v", "test_score": 50.0 + seed, "metric": "accuracy", "higher_is_better": True,
            "code_hashes": {"mymod": plugin_hash, "attnbench.tasks.uea": "cafe"}}


def test_the_report_refuses_to_average_records_made_by_different_code(workdir, capsys):
    from bench_cli.results.csv_store import write_rows

    write_rows(workdir / "res.csv", [record(0, "aaaa1111"), record(1, "bbbb2222"), record(2, "bbbb2222")])
    with pytest.raises(SystemExit) as e:
        main(["report", "--records", str(workdir / "res.csv"), "--no-write"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "Fixture/elu_linear: records made by different code (mymod aaaa1111 (seed 0) vs bbbb2222 (seeds 1 2))" in err
    main(["report", "--records", str(workdir / "res.csv"), "--no-write", "--mixed-code"])
    assert "Made by different code, reported together (--mixed-code)" in capsys.readouterr().out


def test_records_without_hashes_are_neither_stale_nor_mixed():
    old = {"status": "ok", "job_key": "k", "seed": "0"}
    assert code_identity.stale_jobs([old]) == {}
    assert code_identity.mixed_code([old, {**old, "seed": "1", "code_hashes": '{"mymod": "aa"}'}]) is None
    gone = {**old, "code_hashes": '{"no_such_plugin_module": "aa", "attnbench.tasks.uea": "bb"}'}
    assert code_identity.stale_jobs([gone]) == {"k": "plugin changed since the record: no_such_plugin_module "
                                                     "(not found)"}  # built-in modules are git's, not the sweep's
