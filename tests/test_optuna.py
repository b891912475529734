"""`attnbench sweep hydra/sweeper=optuna` (a hyperparameter search that loses no trial): every trial a job
with its own record (study, trial), the study stored beside the records and continued by the same command,
the validation score as the objective in the task's direction (the test split never selects), failed and
diverged trials recorded while the study goes on, the best trial per study in `attnbench report`."""
from __future__ import annotations

import math

import pytest

from bench_cli.commands.cli import main
from bench_cli.results.csv_store import read_records
from test_sweep import sweep, tiny

# In the xdist worker of the manual's commands (tests/test_docs_commands.py), whose tuning sweeps
# import optuna too: its import (3.6 s, scipy.stats and matplotlib with it) is paid once.
pytestmark = pytest.mark.xdist_group("manual_commands")


@pytest.fixture(autouse=True)
def optuna_installed():
    """Skip without the tune extra. Imported by the tests that run, not at collection: optuna's
    import is 2 s of every worker's start."""
    pytest.importorskip("optuna")


def load_study(**kwargs):
    import optuna

    return optuna.load_study(**kwargs)


def study_summaries(storage: str) -> list:
    import optuna

    return optuna.get_all_study_summaries(storage)


SEARCH = ["hydra/sweeper=optuna", "hydra.sweeper.sampler.seed=0", "hydra.sweeper.n_jobs=2",
          "trainer.optimizer.lr=tag(log, interval(1e-4,1e-1))", "task.backbone.dropout=interval(0,0.3)"]

TOLD = {"ok": "COMPLETE", "nan": "PRUNED", "failed": "FAIL"}  # a record's status -> its trial's state


def stored(workdir, records: str = "res.csv") -> list:
    """The trials of the records file's only study, by number."""
    storage = f"sqlite:///{workdir / records}.optuna.db"
    (summary,) = study_summaries(storage)
    return sorted(load_study(study_name=summary.study_name, storage=storage).trials, key=lambda t: t.number)


@pytest.mark.slow
def test_a_study_of_tiny_jobs_records_each_trial_and_continues(uea_fixture, workdir, capsys):
    args = [*tiny(workdir), "trainer.max_epochs=1", *SEARCH, "hydra.sweeper.n_trials=4"]
    assert sweep(*args, "--dry-run") == 0
    assert "1 study of 4 trials" in capsys.readouterr().out and not (workdir / "res.csv.optuna.db").exists()

    assert sweep(*args) == 0
    out = capsys.readouterr().out  # the search's progress after each batch (n_jobs=2: two trials), all at the end
    assert "search progress: 2 done, 0 failed, 0 running, 2 to go; ETA " in out
    assert "search progress: 4 done, 0 failed, 0 running, 0 to go; ETA 0 s" in out
    rows = read_records(workdir / "res.csv")
    assert len(rows) == 4 and {r["status"] for r in rows} == {"ok"}
    assert sorted(int(r["trial"]) for r in rows) == [0, 1, 2, 3] and len({r["study"] for r in rows}) == 1
    assert len({r["job_key"] for r in rows}) == 4  # four sampled configurations, four jobs
    trials = stored(workdir)
    assert [t.state.name for t in trials] == ["COMPLETE"] * 4
    by_trial = {int(r["trial"]): r for r in rows}
    for t in trials:  # the objective is the record's validation score, the values the record's overrides
        assert t.value == float(by_trial[t.number]["val_score"])
        assert f"trainer.optimizer.lr={t.params['trainer.optimizer.lr']}" in by_trial[t.number]["overrides"]
        assert 0 <= t.params["task.backbone.dropout"] <= 0.3

    # The same command: nothing to ask, nothing run. Five trials: one more, trial 4.
    assert sweep(*args) == 0
    assert len(read_records(workdir / "res.csv")) == 4
    assert sweep(*args[:-1], "hydra.sweeper.n_trials=5") == 0
    rows = read_records(workdir / "res.csv")
    assert len(rows) == 5 and rows[-1]["trial"] == "4" and rows[-1]["study"] == rows[0]["study"]
    assert len({r["job_key"] for r in rows}) == 5 and len(stored(workdir)) == 5


@pytest.fixture
def scored_runs(monkeypatch):
    """Jobs launched for real that train nothing: the record's validation score grows with the
    learning rate and its test score falls with it (a test split that would select the opposite
    trial); lr above 0.05 diverges (nan), below 2e-4 crashes (failed)."""
    from bench_cli.engine import runner
    from bench_cli.results import csv_store, job_keys

    def run_experiment(cfg, run_dir, progress=None, overrides=None, run_id=None, line_prefix="", columns=None):
        lr = float(cfg.trainer.optimizer.lr)
        status = "nan" if lr > 0.05 else "failed" if lr < 2e-4 else "ok"
        row = {"run_id": f"fake{columns['trial']}", "status": status, "job_key": job_keys.job_key(cfg),
               "experiment": cfg.get("experiment_name") or "", "model": cfg.model.name, "dataset": cfg.task.dataset,
               "metric": "accuracy", "higher_is_better": True, "overrides": " ".join(overrides or ()),
               **({"val_score": 1000 * lr, "test_score": -1000 * lr} if status == "ok" else {}), **columns}
        csv_store.append_record(cfg.results.path, row)
        return runner.RunOutcome(row)

    monkeypatch.setattr(runner, "run_experiment", run_experiment)


def test_validation_selects_failures_are_recorded_and_the_study_goes_on(uea_fixture, workdir, scored_runs, capsys):
    assert sweep(*tiny(workdir), *SEARCH, "hydra.sweeper.n_trials=8") == 0
    rows = read_records(workdir / "res.csv")
    assert len(rows) == 8 and {"nan", "failed", "ok"} <= {r["status"] for r in rows}
    trials = stored(workdir)
    states = {t.number: t.state.name for t in trials}
    for r in rows:  # diverged: pruned (the worst for the sampler); crashed: failed; the others complete
        assert states[int(r["trial"])] == TOLD[r["status"]]
    ok = [r for r in rows if r["status"] == "ok"]
    best_val = max(ok, key=lambda r: float(r["val_score"]))
    best = load_study(study_name=rows[0]["study"], storage=f"sqlite:///{workdir / 'res.csv'}.optuna.db").best_trial
    assert best.number == int(best_val["trial"]) and best.value == float(best_val["val_score"])
    best_test = max(ok, key=lambda r: float(r["test_score"]))  # what the test split would have chosen
    assert best_test["trial"] != best_val["trial"] and best.value != float(best_test["val_score"])
    assert all(not math.isclose(t.value, float(r["test_score"])) for t in trials if t.value is not None
               for r in rows if r["trial"] == str(t.number))

    # The report of the records file shows the study's best trial: chosen by validation, its test beside it.
    capsys.readouterr()
    main(["report", "--records", str(workdir / "res.csv"), "--no-write"])
    out = capsys.readouterr().out
    assert "best trial per study" in out and f"{float(best_val['val_score']):,.2f}" in out
    assert f"{float(best_val['test_score']):,.2f}" in out


def test_the_direction_is_the_tasks_a_regression_study_minimises(tser_fixture, workdir, scored_runs):
    """task=tser selects on RMSE, lower is better: the study minimises, its best trial the lowest."""
    args = ["task=tser", *tiny(workdir)[1:], "task.dataset=RegFixture", *SEARCH, "hydra.sweeper.n_trials=4"]
    assert sweep(*args) == 0
    rows = read_records(workdir / "res.csv")
    study = load_study(study_name=rows[0]["study"], storage=f"sqlite:///{workdir / 'res.csv'}.optuna.db")
    assert study.direction.name == "MINIMIZE"
    assert study.best_value == min(float(r["val_score"]) for r in rows if r["status"] == "ok")


def test_search_spaces_and_what_an_optuna_sweep_refuses(uea_fixture, workdir, capsys):
    """interval(), tag(log, interval()), choice() and range() are searched; a comma list makes one
    study per value; a grid (the basic sweeper) refuses interval(); a protocol that selects on TEST
    is refused."""
    args = [*tiny(workdir), "hydra/sweeper=optuna", "hydra.sweeper.n_trials=3", "model=softmax,attention_bn",
            "task.backbone.dropout=interval(0,0.3)", "trainer.batch_size=choice(4,8)", "task.backbone.d_ff=range(16,64,16)"]
    assert sweep(*args, "--dry-run") == 0
    out = capsys.readouterr().out
    searching = out.split("searching ", 1)[1].split(";")[0]
    assert "2 studies of 3 trials" in out and set(searching.split(", ")) == {
        "task.backbone.dropout", "trainer.batch_size", "task.backbone.d_ff"}
    assert "softmax seed=0" in out and "attention_bn seed=0" in out and "objective: the validation accuracy (maximize)" in out

    assert sweep(*tiny(workdir), "task.backbone.dropout=interval(0,0.3)", "--dry-run") == 2
    assert "interval() is for search sweepers (Optuna): `attnbench sweep hydra/sweeper=optuna" in capsys.readouterr().err
    assert sweep(*args, "task.protocol=paper", "--dry-run") == 2
    assert "protocol paper selects on the test split" in capsys.readouterr().err
    assert sweep(*args, "hydra.sweeper.direction=minimize", "--dry-run") == 2  # Hydra's default, not accuracy's
    assert "the objective is the validation accuracy, which the task maximizes" in capsys.readouterr().err


def test_the_worked_example_tunes_two_attentions_and_reports_the_best_of_each(workdir, scored_runs, capsys):
    """conf/experiment/tuning/uea_lr_dropout.yaml (docs/tuning.md): JapaneseVowels (inside sktime),
    a study per attention; `attnbench report tuning/uea_lr_dropout` shows each study's best trial."""
    records = f"results.path={workdir / 'local' / 'r.csv'}"  # a folder the sweep makes (the study's storage too)
    assert sweep("experiment=tuning/uea_lr_dropout", records, "--dry-run") == 0
    out = capsys.readouterr().out
    assert "2 studies of 12 trials, searching trainer.optimizer.lr, task.backbone.dropout" in out
    assert "tuning/uea_lr_dropout: uea/JapaneseVowels softmax seed=0" in out
    assert "tuning/uea_lr_dropout: uea/JapaneseVowels attention_bn seed=0" in out

    assert sweep("experiment=tuning/uea_lr_dropout", records, "hydra.sweeper.n_trials=2") == 0
    rows = read_records(workdir / "local" / "r.csv")
    assert sorted((r["model"], r["trial"]) for r in rows) == [("attention_bn", "0"), ("attention_bn", "1"),
                                                              ("softmax", "0"), ("softmax", "1")]
    capsys.readouterr()
    main(["report", "tuning/uea_lr_dropout", "--records", str(workdir / "local" / "r.csv"), "--out", str(workdir / "rep")])
    md = (workdir / "rep" / "tuning" / "uea_lr_dropout.md").read_text()
    for model in ("softmax", "attention_bn"):
        ok = [r for r in rows if r["model"] == model and r["status"] == "ok"]
        best = max(ok, key=lambda r: float(r["val_score"]))
        line = next(line for line in md.splitlines() if f"| {model} |" in line)
        assert f"| {best['trial']} | {float(best['val_score']):,.2f} | {float(best['test_score']):,.2f} |" in line
    assert f"--records {workdir / 'local' / 'r.csv'}" in md  # the command that rewrites it


def test_a_trial_left_running_by_a_killed_sweep_is_run_when_the_study_continues(uea_fixture, workdir, scored_runs):
    """A trial asked but never told (the sweep killed while its job ran) keeps its values: the next
    sitting runs that job (from its checkpoint, in a real run) and tells it, instead of asking anew."""
    args = [*tiny(workdir), *SEARCH, "hydra.sweeper.n_trials=2"]
    assert sweep(*args) == 0
    (summary,) = study_summaries(f"sqlite:///{workdir / 'res.csv'}.optuna.db")
    study = load_study(study_name=summary.study_name, storage=f"sqlite:///{workdir / 'res.csv'}.optuna.db")
    left = study.ask(fixed_distributions=study.trials[0].distributions)  # what the killed sweep had asked
    assert sweep(*args[:-1], "hydra.sweeper.n_trials=3") == 0
    rows = read_records(workdir / "res.csv")
    assert [r["trial"] for r in rows] == ["0", "1", "2"] and left.number == 2
    assert f"trainer.optimizer.lr={left.params['trainer.optimizer.lr']}" in rows[-1]["overrides"]
    assert [t.state.name for t in stored(workdir)] == [TOLD[r["status"]] for r in rows]  # its lr may diverge


def test_committed_records_without_study_columns_still_load_and_gain_blank_ones(workdir):
    """Records written before the study columns existed read as before (no study: no best-trial
    section); a row appended to such a file adds the columns, blank for the earlier rows and for
    any run that is not a trial."""
    import shutil
    from pathlib import Path

    from bench_cli.results.csv_store import append_record
    from bench_cli.results.report.trials import best_trials

    committed = Path(__file__).resolve().parents[1] / "results" / "reproduced" / "primal_dual" / "table1.records.csv"
    before = read_records(committed)
    assert before and "study" not in before[0] and best_trials(before) == []
    shutil.copy(committed, workdir / "old.csv")
    append_record(workdir / "old.csv", {"run_id": "new", "status": "ok"})
    after = read_records(workdir / "old.csv")
    assert len(after) == len(before) + 1 and {(r["study"], r["trial"]) for r in after} == {("", "")}
    assert [{k: v for k, v in r.items() if k in before[0]} for r in after[:-1]] == before


# --- a study database that cannot be used, a study searched twice at once, counts -----------------
@pytest.mark.parametrize("content", [b"\x00\xffgarbage bytes, not SQLite" * 40, b"SQLite format 3\x00" + b"\x00" * 200,
                                     None])
def test_a_study_storage_it_cannot_use_is_one_line_before_any_trial(uea_fixture, workdir, scored_runs, capsys, content):
    db = workdir / "res.csv.optuna.db"
    if content is None:
        db.mkdir()  # a folder where the database belongs
    else:
        db.write_bytes(content)
    for dry in ([], ["--dry-run"]):
        assert sweep(*tiny(workdir), *SEARCH, "hydra.sweeper.n_trials=2", *dry) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "study storage " in err and str(db) in err, err
        assert "Traceback" not in err and "hydra.sweeper.storage" in err
    assert read_records(workdir / "res.csv") == []  # nothing trained
    assert db.is_dir() if content is None else db.read_bytes() == content  # left as it was


@pytest.mark.parametrize("value", ["-1", "0", "abc", "1.5"])
def test_a_count_of_trials_below_one_is_one_line(uea_fixture, workdir, capsys, value):
    assert sweep(*tiny(workdir), *SEARCH, f"hydra.sweeper.n_trials={value}", "--dry-run") == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "hydra.sweeper.n_trials" in err, err


def test_the_same_study_searched_twice_at_once_never_exceeds_its_trials(uea_fixture, workdir, scored_runs, monkeypatch,
                                                                        capsys):
    """Another sweep of the same study (another terminal) asks and completes a trial while this
    one runs its first: between them the study holds n_trials, and the progress never goes below 0."""
    import optuna

    from bench_cli.commands import study as study_command

    original, storage = study_command.run_trials, f"sqlite:///{workdir / 'res.csv'}.optuna.db"

    def and_another_sweep_meanwhile(sweep_, study, s, planned, n_trials, launched):
        ran = original(sweep_, study, s, planned, n_trials, launched)
        if launched == 0:
            other = optuna.load_study(study_name=s.name, storage=storage)
            trial = other.ask(fixed_distributions=planned[0][0].distributions)
            other.tell(trial, 1.0)
        return ran

    monkeypatch.setattr(study_command, "run_trials", and_another_sweep_meanwhile)
    assert sweep(*tiny(workdir), *SEARCH, "hydra.sweeper.n_jobs=1", "hydra.sweeper.n_trials=2") == 0
    out = capsys.readouterr().out
    assert len(stored(workdir)) == 2 and len(read_records(workdir / "res.csv")) == 1
    assert "-1 to go" not in out and "ETA -" not in out
    assert "search progress: 2 done, 0 failed, 0 running, 0 to go" in out


def test_the_median_pruner_stops_a_trial_below_the_median_of_earlier_curves(workdir):
    """bench_cli/engine/pruning.py against a real study: an earlier trial at 90 at step 4, the new
    trial's 10 there is pruned (PrunedError, status pruned); 95 is not."""
    import optuna

    from bench_cli.core.errors import PrunedError
    from bench_cli.engine.pruning import PRUNING, trial_pruning
    from bench_cli.results.schema import ending

    storage = f"sqlite:///{workdir / 's.db'}"
    study = optuna.create_study(study_name="s", storage=storage, direction="maximize")
    first = study.ask()
    first.report(90.0, step=4)
    study.tell(first, 90.0)
    for value, pruned in ((95.0, False), (10.0, True)):
        trial = study.ask()
        columns, pruning = trial_pruning({"study": "s", "trial": trial.number, PRUNING: {
            "storage": storage, "study": "s", "trial_id": trial._trial_id, "metric": "accuracy", "startup_trials": 1}})
        assert columns == {"study": "s", "trial": trial.number}  # never a record column
        if pruned:
            with pytest.raises(PrunedError, match="median pruner") as e:
                pruning({"step": 4, "val_accuracy": value})
            assert ending(e.value)["status"] == "pruned"
        else:
            pruning({"step": 4, "val_accuracy": value})
        assert load_study(study_name="s", storage=storage).trials[trial.number].intermediate_values == {4: value}


@pytest.mark.slow
def test_a_pruned_search_confirms_its_best_setting_over_seeds(uea_fixture, workdir, capsys):
    """tuning.pruner=median: every trial reports its validation curve (pruned ones recorded as
    pruned, told PRUNED); tuning.confirm_top=1 reruns the best trial with seed 1 (seed 0 is its own
    run) and the report says the selection was confirmed over seeds."""
    args = [*tiny(workdir), "trainer.max_epochs=2", *SEARCH[:2], "hydra.sweeper.n_jobs=1", SEARCH[3],
            "hydra.sweeper.n_trials=3", "tuning.pruner=median", "tuning.pruner_startup_trials=1",
            "tuning.confirm_top=1", "tuning.confirm_seeds=[0,1]"]
    assert sweep(*args) == 0
    out = capsys.readouterr().out
    rows = read_records(workdir / "res.csv")
    trials, confirming = [r for r in rows if r["trial"]], [r for r in rows if r["confirms_trial"]]
    assert len(trials) == 3 and {r["status"] for r in trials} <= {"ok", "pruned"}
    stored_trials = stored(workdir)
    assert all(t.intermediate_values for t in stored_trials)  # each trial reported its curve
    for r in trials:
        assert stored_trials[int(r["trial"])].state.name == {"ok": "COMPLETE", "pruned": "PRUNED"}[r["status"]]
    (confirm,) = confirming
    assert confirm["seed"] == "1" and confirm["status"] == "ok" and "confirmed" in out and "selected: trial" in out
    best = max((r for r in trials if r["status"] == "ok"), key=lambda r: (float(r["val_score"]), -int(r["trial"])))
    assert confirm["confirms_trial"] == best["trial"]
    main(["report", "--records", str(workdir / "res.csv"), "--no-write", "--width", "200"])
    out = capsys.readouterr().out.replace("\n  ", " ")
    assert "rerun over up to 2 seeds" in out and "the best settings confirmed over seeds" in out
