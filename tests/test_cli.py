"""The `attnbench` CLI end to end: runs, records, determinism, errors (wandb offline: test_logging)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench_cli.commands.cli import main
from bench_cli.results.csv_store import read_records
from bench_cli.results.schema import COLUMNS
from conftest import attnbench

TINY = ["task.dataset=Fixture", "task.backbone.d_model=16", "task.backbone.n_heads=2", "task.backbone.n_layers=1",
        "task.backbone.d_ff=32", "trainer.max_epochs=3", "trainer.batch_size=8", "trainer.progress=false"]


def run_cli(*args: str) -> None:
    main(["run", *args])


def fail_line(capsys, *args: str) -> str:
    """Run the CLI expecting a user error: exit status 2 and exactly one line on stderr."""
    with pytest.raises(SystemExit) as e:
        main(list(args))
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


@pytest.mark.slow
def test_run_end_to_end_writes_a_complete_record(uea_fixture, workdir):
    run_cli(*TINY, "seed=1", "results.path=res.csv", "trainer.max_epochs=5", "trainer.optimizer.lr=1e-2")
    (row,) = read_records(workdir / "res.csv")
    assert list(row)[: len(COLUMNS)] == COLUMNS
    assert row["status"] == "ok" and row["task"] == "uea" and row["dataset"] == "Fixture"
    assert row["model"] == "softmax" and row["seed"] == "1" and row["protocol"] == "holdout"
    # the fixture's classes are the sign of channel 0: a model that learns is far above chance (50 %)
    assert float(row["test_accuracy"]) >= 90.0 and float(row["val_accuracy"]) >= 90.0
    history = json.loads(row["metrics_json"])["history"]
    assert history[-1]["train_loss"] < 0.8 * history[0]["train_loss"]
    for k in ("params", "attn_params", "flops_forward", "flops_train_step", "peak_mem_train_bytes",
              "peak_mem_infer_bytes", "train_time_s"):
        assert float(row[k]) > 0, k
    assert int(row["flops_train_step"]) > 2 * int(row["flops_forward"])
    assert int(row["peak_mem_train_bytes"]) > int(row["peak_mem_infer_bytes"])
    # the median epoch with its IQR (not total / epochs), and what the machine was doing
    assert float(row["time_per_epoch_s_q1"]) <= float(row["time_per_epoch_s"]) <= float(row["time_per_epoch_s_q3"])
    assert row["load_before"] != "" and int(row["threads"]) >= 1 and "timing_noisy" in row
    assert row["device"] == "cpu" and row["precision"] == "32"  # what it trained on and in
    assert len(row["git_commit"]) in (40, 7) or row["git_commit"] == "unknown"
    assert row["torch_version"] and row["attnbench_version"] and len(row["config_hash"]) == 16
    cfg_path = Path(row["config_path"])
    assert cfg_path.is_file() and "Fixture" in cfg_path.read_text()


@pytest.mark.slow
def test_same_seed_same_metrics_and_run_dirs_do_not_collide(uea_fixture, workdir):
    for _ in range(2):
        run_cli(*TINY, "seed=7", "results.path=res.csv")
    a, b = read_records(workdir / "res.csv")
    assert a["test_accuracy"] == b["test_accuracy"] and a["val_accuracy"] == b["val_accuracy"]
    assert a["metrics_json"] == b["metrics_json"]  # identical per-epoch curves
    assert a["output_dir"] != b["output_dir"] and a["run_id"] != b["run_id"]
    assert a["config_hash"] == b["config_hash"]


@pytest.mark.slow
def test_paper_protocol_is_recorded(uea_fixture, workdir):
    run_cli(*TINY, "task.protocol=paper", "results.path=res.csv")
    (row,) = read_records(workdir / "res.csv")
    assert row["protocol"] == "paper" and row["val_accuracy"] == ""


@pytest.mark.slow
def test_step_budget_cuts_big_schedules_and_spares_small_ones(uea_fixture, workdir):
    """40 training series at batch 8 are 5 steps per epoch: a 7-step budget leaves ceil(7/5) = 2 of
    the 3 epochs; a 100-step budget leaves all 3."""
    for budget in (7, 100):
        run_cli(*TINY, "task.protocol=paper", f"trainer.step_budget={budget}", "results.path=res.csv")
    cut, spared = read_records(workdir / "res.csv")
    assert (int(cut["epochs_run"]), int(spared["epochs_run"])) == (2, 3)


@pytest.mark.slow
def test_eval_every_epochs_follows_the_reference_rule(uea_fixture, workdir):
    """mvts_transformer's --val_interval: the first, every k-th and the last epoch."""
    for every in (2, 1):
        run_cli(*TINY, "task.protocol=paper", "task.backbone.dropout=0.3", "trainer.max_epochs=5",
                f"trainer.eval_every_epochs={every}",
                "results.path=res.csv")
    sparse, dense = read_records(workdir / "res.csv")
    history = {e: json.loads(r["metrics_json"])["history"] for e, r in ((2, sparse), (1, dense))}
    assert [h["epoch"] for h in history[2]] == [1, 2, 4, 5]
    assert int(sparse["epochs_run"]) == 5 and int(sparse["best_epoch"]) in (1, 2, 4, 5)
    # Evaluating less often does not change training: the evaluations both runs made agree.
    dense_at = {h["epoch"]: (h["test_accuracy"], h["test_loss"]) for h in history[1]}
    assert all((h["test_accuracy"], h["test_loss"]) == dense_at[h["epoch"]] for h in history[2])


def test_unknown_model_lists_choices(capsys, workdir):
    err = fail_line(capsys, "run", "model=softmx")
    assert "unknown model 'softmx'" in err and "did you mean 'softmax'" in err and "valid:" in err


def test_unknown_task_and_dataset(capsys, workdir):
    assert "unknown task 'ueaa'" in fail_line(capsys, "run", "task=ueaa")
    err = fail_line(capsys, "run", "task.dataset=BasicMotion")
    assert "did you mean 'BasicMotions'" in err


def test_missing_dataset_says_where_and_how(capsys, workdir):
    err = fail_line(capsys, "run", "task.dataset=EthanolConcentration")
    assert str(workdir / "data" / "uea" / "EthanolConcentration") in err
    assert "attnbench data uea EthanolConcentration" in err


def test_a_grid_with_missing_data_is_refused_before_every_job_is_composed(capsys, workdir, monkeypatch):
    """Table 1's 200 jobs: one job per dataset is composed to find the missing data (not all 200)."""
    from bench_cli.commands.sweep import plan

    real, composed = plan.plan_job, []
    monkeypatch.setattr(plan, "plan_job", lambda *a: composed.append(a) or real(*a))
    err = fail_line(capsys, "sweep", "experiment=primal_dual/table1")
    assert "(and 8 more datasets); or restrict the dataset axis to what is here: task.dataset=JapaneseVowels" in err
    assert len(composed) == 10


def test_help_lists_ls_runs_and_run_help_lists_the_options_not_hydras_banner(capsys, workdir):
    main(["--help"])
    assert "ls [tasks|datasets|models|experiments|runs]" in capsys.readouterr().out
    main(["run", "--help"])
    out = capsys.readouterr().out
    assert out.startswith("usage: attnbench run") and "powered by Hydra" not in out
    assert "primal_dual/table1" in out and "softmax" in out and "--cfg job" in out
    assert "_uea" not in out and "_case" not in out and "_budget" not in out


def test_a_failed_download_does_not_suggest_the_command_that_failed(capsys, workdir, monkeypatch):
    from attnbench.tasks.vision import datasets as vision_datasets

    def no_network(root):
        raise OSError("Error downloading train-images-idx3-ubyte.gz:")

    monkeypatch.setattr(vision_datasets, "download_mnist", no_network)
    err = fail_line(capsys, "data", "vision", "mnist")
    assert "cannot download mnist" in err and "put the idx files" in err
    assert "attnbench data vision mnist" not in err


def test_bad_override_names_the_key(capsys, workdir):
    err = fail_line(capsys, "run", "trainer.max_epoch=5")
    assert "trainer.max_epoch" in err and "did you mean 'trainer.max_epochs'" in err
    err = fail_line(capsys, "run", "trainer.max_epochs=")
    assert "trainer.max_epochs" in err or "bad override" in err
    assert "bad override" in fail_line(capsys, "run", "model=[")
    # a dict of the config given keys it does not have: how to add them, not 'unknown key'
    err = fail_line(capsys, "validate", "task=lra_listops", "task.generator={max_length:250}")
    assert "cannot set 'task.generator' to {max_length:250}" in err and "+task.generator.NAME=VALUE" in err


def test_unknown_command(capsys):
    assert "did you mean 'run'" in fail_line(capsys, "rn")


@pytest.mark.parametrize("flag", ["--version", "-V"])
def test_version_prints_the_installed_version(capsys, flag):
    from bench_cli import __version__

    main([flag])
    assert capsys.readouterr().out == f"attnbench {__version__}\n"


def test_validate_prints_config_and_builds_model(capsys, workdir):
    main(["validate", "task=uea", "model=softmax"])
    out = capsys.readouterr().out
    assert "dataset: JapaneseVowels" in out and "ok" in out and "parameters" in out


def test_ls_shows_tasks_datasets_models(capsys, workdir):
    main(["ls"])
    out = capsys.readouterr().out
    assert "uea" in out and "softmax" in out and "attnbench ls tasks" in out
    main(["ls", "datasets"])
    out = capsys.readouterr().out
    assert "JapaneseVowels" in out and "in package" in out
    assert "EthanolConcentration" in out and "missing" in out
    main(["ls", "tasks"])
    out = capsys.readouterr().out
    assert "uea" in out and "lra_listops" in out and "JapaneseVowels" not in out


def test_ls_experiments_fits_80_columns_with_every_name_whole(capsys, workdir):
    from bench_cli.config import compose

    main(["ls", "experiments"])
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert len(lines) > 1 and all(len(line.rstrip()) <= 80 for line in lines)  # off a terminal: 80 columns
    listed = [w.strip(",") for w in out.split(": ", 1)[1].split()]
    assert listed == compose.group_options("experiment")  # wrapped between names, never inside one


def test_console_script_exits_2_with_one_line(workdir):
    r = attnbench("run", "model=no_such_model", env={"COLUMNS": "200"}, timeout=120)
    assert r.returncode == 2
    assert len(r.stderr.strip().splitlines()) == 1 and "unknown model 'no_such_model'" in r.stderr
    assert "Traceback" not in r.stderr + r.stdout


def test_make_help_fits_80_columns_and_lists_every_target_unbroken():
    """`make help` on a pipe: at most 80 columns, every `target: ## text` of the Makefiles once, in
    order, in the first column and never cut; the descriptions wrap under their own column."""
    import re
    import shutil
    import subprocess

    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run(["make", "-s", "help"], cwd=root, capture_output=True, text=True, timeout=60).stdout
    lines = out.splitlines()
    assert lines and max(len(line) for line in lines) <= 80, max(lines, key=len)
    assert "\033[" not in out  # no colour codes on a pipe
    files = [root / "Makefile", *sorted((root / "mk").glob("*.mk"))]
    targets = [m for f in files for m in re.findall(r"^([a-zA-Z0-9_-]+):.*## ", f.read_text(), re.M)]
    assert [line.split()[0] for line in lines if line[2:3] != " "] == targets
    width = max(map(len, targets))
    assert all(line[2 + width:4 + width] == "  " for line in lines if line[2:3] != " ")


# --- experiments state their tasks (a typo in a task name is caught, not run as another) ------
def test_every_experiment_is_for_known_tasks_and_composes_to_one_of_them(workdir):
    from bench_cli.config import catalog
    from bench_cli.config import compose

    experiments = compose.group_options("experiment")
    for name in experiments:
        tasks = compose.experiment_tasks(name)
        assert tasks and set(tasks) <= set(catalog.tasks()), (name, tasks)
    # Hydra agrees, for each way an experiment selects its task: the root default, its own
    # `override /task`, its parent's, a sweep over tasks (composing all of them takes half a minute)
    expected = {"primal_dual/table1": ["uea"], "pay_better_attention/table2": ["textcls"],
                "pay_better_attention/table1": ["vit"], "primal_attention/d4rl": ["d4rl"],
                "primal_dual/table2": ["lra_image", "lra_listops", "lra_pathfinder", "lra_retrieval", "lra_text"]}
    with compose.composer() as compose_one:
        for name, tasks in expected.items():
            assert compose.experiment_tasks(name) == tasks
            assert compose_one([f"experiment={name}"]).task.name in tasks, name


@pytest.mark.parametrize("command", ["validate", "run", "sweep"])
def test_a_task_the_experiment_is_not_for_is_one_line_first(command, capsys, workdir):
    err = fail_line(capsys, command, "experiment=primal_dual/table1", "task=lm")
    assert "experiment primal_dual/table1 is for task uea, not lm" in err
    assert "experiments for lm: primal_attention/wikitext103" in err and "sweep" not in err


# --- overrides that need quotes (the shell splits them: the error shows the quoted form) ---------
@pytest.mark.parametrize("override", ["task.dataset=Bäsic™Motions", "results.path=my results/ré.csv"])
def test_a_value_that_needs_quotes_says_so_and_shows_the_quoted_form(override, capsys, workdir):
    key, value = override.split("=", 1)
    err = fail_line(capsys, "run", override)
    assert "needs quotes" in err and f"""'{key}="{value}"'""" in err


def test_quoted_values_with_spaces_and_accents_work(uea_fixture, capsys, workdir):
    main(["validate", *TINY, 'results.path="my results/ré.csv"'])
    assert "path: my results/ré.csv" in capsys.readouterr().out
    err = fail_line(capsys, "validate", *TINY, 'task.dataset="Bäsic™Motions"')
    assert "unknown UEA dataset 'Bäsic™Motions'" in err  # the value arrived whole


def test_a_run_composes_and_resolves_its_config_once(uea_fixture, capsys, workdir, monkeypatch):
    """`attnbench run` composes its config once: the defaults its value overrides replace are read
    in that composition, not in a second one of the group choices alone (a second one costs time), and a value of
    the wrong type is still refused. The run resolves the whole config once (config.yaml, keys, logger)."""
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from omegaconf import OmegaConf

    from bench_cli.config import checks

    checks._group_defaults.cache_clear()  # another test's composition of the same group choices would hide one
    compositions, resolutions = [], []
    load, to_container = ConfigLoaderImpl._load_configuration_impl, OmegaConf.to_container

    def composed(self, *args, **kwargs):
        compositions.append(args)
        return load(self, *args, **kwargs)

    def converted(cfg, *args, **kwargs):
        if kwargs.get("resolve") and OmegaConf.is_config(cfg) and cfg._get_parent() is None:
            resolutions.append(cfg)
        return to_container(cfg, *args, **kwargs)

    monkeypatch.setattr(ConfigLoaderImpl, "_load_configuration_impl", composed)
    monkeypatch.setattr(OmegaConf, "to_container", staticmethod(converted))
    run_cli(*TINY, "seed=2", "results.path=res.csv")
    (row,) = read_records(workdir / "res.csv")
    assert row["status"] == "ok" and (len(compositions), len(resolutions)) == (1, 1)
    assert "expected an integer, like the default 32" in fail_line(capsys, "run", *TINY, "trainer.batch_size=1.5")
    assert len(compositions) == 2


# --- user config folders (a user's own models and root config, beside the project's) -------------
@pytest.fixture
def user_conf(tmp_path, monkeypatch):
    """A user folder with a model of its own, and one with a root config.yaml selecting it; the
    process's config folders are restored afterwards."""
    from bench_cli.config import checks, keys, search_path

    monkeypatch.setattr(search_path, "_CONFIG_DIRS", [])
    monkeypatch.setattr(search_path, "_CONFIG_PATH", [])
    keys._top_level_keys.cache_clear()
    models = tmp_path / "userconf"
    (models / "model").mkdir(parents=True)
    (models / "model" / "mysoft.yaml").write_text("defaults:\n  - softmax\nname: mysoft\n")
    root = tmp_path / "userroot"
    (root / "model").mkdir(parents=True)
    (root / "model" / "mysoft.yaml").write_text("defaults:\n  - softmax\nname: mysoft\n")
    text = (search_path.conf_dir() / "config.yaml").read_text().replace("  - model: softmax", "  - model: mysoft")
    (root / "config.yaml").write_text(text)
    yield models, root
    keys._top_level_keys.cache_clear()
    checks._group_defaults.cache_clear()


def test_config_dir_and_config_path_compose_a_users_model(uea_fixture, user_conf, capsys, workdir):
    models, root = user_conf
    main(["validate", "--config-dir", str(models), "model=mysoft", *TINY])
    assert "ok: model mysoft" in capsys.readouterr().out
    main(["sweep", "--config-dir", str(models), "model=mysoft,softmax", "--dry-run", *TINY])
    assert "mysoft" in capsys.readouterr().out
    main(["validate", "--config-path", str(root), *TINY])  # the user's config.yaml selects mysoft
    assert "ok: model mysoft" in capsys.readouterr().out


def test_config_path_without_a_root_config_points_to_config_dir(user_conf, capsys, workdir):
    models, _ = user_conf
    for command in ("run", "validate", "sweep"):
        err = fail_line(capsys, command, "--config-path", str(models))
        assert "no config.yaml" in err and f"--config-dir {models}" in err


# --- paths at 80 columns (printed whole, so they can be copied from the terminal) ----------------
def test_run_summary_prints_long_paths_unbroken_at_80_columns(workdir):
    import os
    import subprocess
    import sys

    folder = str(workdir / ("outputs/runs/2026-01-01/" + "r" * 70))
    records = str(workdir / ("results/" + "a_long_records_file_name_" * 3 + ".csv"))
    row = dict(run_id="20260101-000000-abcd", status="ok", task="uea", dataset="Fixture", model="softmax",
               attention="softmax", seed=0, protocol="holdout", test_score=98.6, output_dir=folder)
    code = f"from bench_cli.core.ui import print_summary; print_summary({row!r}, {records!r})"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "COLUMNS": "80"}).stdout
    lines = out.splitlines()
    assert folder in lines and records in lines  # each on a line of its own, whole
    assert max(len(line) for line in lines if line not in (folder, records)) <= 80


def test_every_command_answers_help_with_its_usage_in_80_columns_and_exit_0(capsys, workdir):
    """`attnbench VERB --help` never refuses --help as an unknown option: every verb prints a usage
    (its own, or its entry of the main usage with the options it takes), folded to 80 columns
    without a word, option or path cut (every word of the text is still whole in it)."""
    import re

    from bench_cli.commands import cli
    from bench_cli.commands.cli import COMMANDS

    for command in [None, *COMMANDS.names()]:
        main(["--help"] if command is None else [command, "--help"])
        out = capsys.readouterr().out
        assert command is None or f"attnbench {command}" in out, (command, out)
        assert "unknown option" not in out
        too_long = [line for line in out.splitlines() if len(line) > 80]
        assert not too_long, (command, too_long)
    words = set(re.findall(r"\S+", cli.USAGE))
    main(["--help"])
    assert words <= set(re.findall(r"\S+", capsys.readouterr().out))


def test_a_mistake_beside_hydras_print_flags_is_one_line(capsys, workdir):
    """`run --cfg job model=nosuch` is the same one line as `run model=nosuch` (Hydra's own
    answer was a multi-line listing and exit status 1)."""
    assert "unknown model 'nosuch'; valid: attention_bn" in fail_line(capsys, "run", "--cfg", "job", "model=nosuch")
    main(["run", "--cfg", "job", "model=linear"])
    assert "name: linear" in capsys.readouterr().out


@pytest.mark.parametrize("args", [["validate", "model=softmax"], ["run", "model=softmax"],
                                  ["sweep", "--dry-run", "seed=0,1"], ["ls", "models"],
                                  ["report", "primal_dual/table1"], ["ls", "runs"]])
def test_a_command_started_in_a_deleted_working_folder_is_one_line(args, capsys, tmp_path, monkeypatch):
    """Hydra records the working folder in every config (``os.getcwd()``) and relative paths start
    from it: a folder deleted under the shell is one line naming it and what to do, for any command."""
    gone = tmp_path / "gone"
    gone.mkdir()
    monkeypatch.chdir(gone)  # restored to the test's folder afterwards
    gone.rmdir()
    monkeypatch.setenv("PWD", str(gone))  # as the shell left it
    line = fail_line(capsys, *args)
    assert f"the working folder {gone} no longer exists" in line and "cd to an existing folder" in line, line
