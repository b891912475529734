"""Plugins (a user's attention or task without editing the repository): a module outside the repository
registers an attention (or a task) and is found through ATTNBENCH_PLUGINS, the `plugins:` config key or an
`attnbench.plugins` entry point; `ls models` shows it, a run and a sweep's workers use it and records name
it; mistakes are one line. The plugin is the manual's own example (docs/models.md), so the documentation
is what is tested."""
from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from bench_cli.config import compose
from bench_cli.config import plugins
from bench_cli.commands.cli import main
from bench_cli.results.csv_store import read_records
from bench_cli.results.job_keys import job_key
from conftest import attnbench, python_path_with

MODELS_DOC = Path(__file__).resolve().parents[1] / "docs" / "models.md"
TINY = ["task.dataset=Fixture", "task.backbone.d_model=16", "task.backbone.n_heads=2", "task.backbone.n_layers=1",
        "task.backbone.d_ff=32", "trainer.max_epochs=1", "trainer.batch_size=8", "trainer.progress=false",
        "measure.flops=false", "measure.memory=false"]
MODEL_YAML = "name: elu\nattention:\n  name: elu_linear\n  dropout: 0.0\nfinal_attention: null\n"
EXPERIMENT_YAML = ("# @package _global_\ndefaults:\n  - override /model: elu\nplugins: [mymod]\n"
                   "experiment_name: elu_fixture\n")


def readme_plugin() -> str:
    """The example plugin of the manual's "Bring your own attention" section (docs/models.md)."""
    section = MODELS_DOC.read_text().split("## Bring your own attention", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


@pytest.fixture
def plugin_dir(tmp_path) -> Path:
    """A folder outside the repository holding the manual's plugin as mymod.py (for processes)."""
    folder = tmp_path / "plugins"
    folder.mkdir()
    (folder / "mymod.py").write_text(readme_plugin())
    return folder


@pytest.fixture
def config_dir(tmp_path) -> Path:
    """A user config folder: the plugin's model preset and an experiment naming the plugin."""
    folder = tmp_path / "myconf"
    (folder / "model").mkdir(parents=True)
    (folder / "experiment").mkdir()
    (folder / "model" / "elu.yaml").write_text(MODEL_YAML)
    (folder / "experiment" / "elu_fixture.yaml").write_text(EXPERIMENT_YAML)
    return folder


@pytest.fixture
def isolated(plugin_folder) -> Path:
    """The manual's plugin as mymod.py in a folder on this process's sys.path, imported in-process
    without leaking into other tests (conftest.plugin_folder)."""
    (plugin_folder / "mymod.py").write_text(readme_plugin())
    return plugin_folder


def fail_line(capsys, *args: str) -> str:
    """Run the CLI in-process expecting a user error: exit status 2 and exactly one line on stderr."""
    with pytest.raises(SystemExit) as e:
        main(list(args))
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


# --- found three ways -----------------------------------------------------------------------------
# In-process, as a fresh process finds them: the plugin's folder first on sys.path (PYTHONPATH), the
# registries and the imported plugins restored afterwards (`isolated`). What only a process shows,
# the console script's exit status on a broken one, is run as a process below; a sweep's worker
# processes importing the plugin, in tests/test_sweep.py's joblib sweep stopped by SIGTERM (its two
# jobs train the plugin's attention).
def test_ls_models_lists_a_plugin_attention_with_its_module(isolated, workdir, capsys, monkeypatch):
    monkeypatch.setenv(plugins.PLUGINS_ENV, "mymod")
    monkeypatch.setenv("COLUMNS", "80")
    main(["ls", "models"])
    out = capsys.readouterr().out
    assert "attention: elu_linear (plugin: mymod)" in out  # 80 columns: one block per row
    assert "Katharopoulos et al. 2020, Eqn. 6" in out
    assert all(len(line) <= 80 for line in out.splitlines() if "elu_linear" in line)


def test_plugin_trains_a_fixture_epoch_and_its_record_names_it(uea_fixture, isolated, workdir, monkeypatch):
    """A registered attention without a yaml is selectable in the default model."""
    monkeypatch.setenv(plugins.PLUGINS_ENV, "mymod")
    main(["run", *TINY, "model.attention.name=elu_linear", "results.path=res.csv"])
    (row,) = read_records(workdir / "res.csv")
    assert row["status"] == "ok" and row["attention"] == "elu_linear" and row["model"] == "elu_linear"
    assert row["plugins"] == f"mymod (no package: {isolated / 'mymod.py'})"
    assert int(row["params"]) > 0


def test_config_key_and_config_dir_select_the_plugin_model(uea_fixture, isolated, config_dir, workdir, capsys):
    """No ATTNBENCH_PLUGINS: the experiment in the user folder names the plugin (`plugins:`)."""
    main(["validate", "--config-dir", str(config_dir), "experiment=elu_fixture", "task.dataset=Fixture"])
    out = capsys.readouterr().out
    assert "ok: model elu:" in out and "elu_linear" in out
    assert [p.found_by for p in plugins.loaded()] == ["config key plugins"]


def test_hydra_searchpath_and_plugins_override_in_process(uea_fixture, isolated, config_dir, capsys):
    from attnbench.models.attention import attention_spec

    main(["validate", f"hydra.searchpath=[file://{config_dir}]", "model=elu", "plugins=[mymod]",
          "task.dataset=Fixture"])
    assert "ok: model elu:" in capsys.readouterr().out
    assert attention_spec("elu_linear").owner == "mymod" and not attention_spec("elu_linear").builtin
    assert [p.found_by for p in plugins.loaded()] == ["config key plugins"]


def test_entry_point_of_an_installed_package(isolated, workdir, capsys):
    """A dist-info with entry_points.txt on sys.path is an installed package to importlib.metadata."""
    info = isolated / "myplug-1.2.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: myplug\nVersion: 1.2\n")
    (info / "entry_points.txt").write_text("[attnbench.plugins]\nelu = mymod\n")
    (info / "top_level.txt").write_text("mymod\n")
    main(["ls", "models"])
    assert "elu_linear (plugin: mymod)" in capsys.readouterr().out
    assert plugins.describe() == "myplug==1.2 (module mymod)"
    # named by ATTNBENCH_PLUGINS as well: imported once, the version found from the module's package
    plugins._LOADED.clear()
    plugins.import_plugin("mymod", plugins.PLUGINS_ENV)
    assert plugins.describe() == "myplug==1.2 (module mymod)"


def test_a_profile_of_a_plugin_attention_is_named_after_it(isolated, workdir, capsys):
    """Its rows and title name the plugin's attention, not the preset it was swapped into."""
    import csv

    main(["profile", "plugins=[mymod]", "model.attention.name=elu_linear", "baseline=softmax", "profile.seq_lens=[8]",
          "task.backbone.d_model=16", "task.backbone.n_heads=2", "task.backbone.n_layers=1", "task.backbone.d_ff=32",
          "profile.output=p.csv", "profile.plot=null", "profile.timing.enabled=false", "profile.flops=off",
          "profile.memory=off", "profile.memory_budget_gb=null", "trainer.progress=false"])
    assert "profile: elu_linear vs softmax on uea" in " ".join(capsys.readouterr().out.split())
    (row,) = csv.DictReader(open(workdir / "p.csv", newline=""))
    assert row["model"] == row["attention"] == "elu_linear"


# --- mistakes: one line ---------------------------------------------------------------------------
def test_broken_or_missing_plugin_is_one_line_naming_it(isolated, workdir, capsys, monkeypatch):
    (isolated / "broken.py").write_text("import torch\nraise RuntimeError('boom: no weights here')\n")
    monkeypatch.setenv(plugins.PLUGINS_ENV, "broken")
    err = fail_line(capsys, "ls")
    assert "plugin broken" in err and "RuntimeError: boom: no weights here" in err
    monkeypatch.setenv(plugins.PLUGINS_ENV, "no_such_plugin")
    err = fail_line(capsys, "ls", "models")
    assert "plugin no_such_plugin" in err and "PYTHONPATH" in err


def test_a_plugin_that_exits_at_import_is_one_line_naming_it(isolated, workdir, capsys, monkeypatch):
    """A plugin is foreign code: sys.exit(3) in its import is not the exit status of `attnbench`."""
    (isolated / "exitimp.py").write_text("import sys\nsys.exit(3)\n")
    monkeypatch.setenv(plugins.PLUGINS_ENV, "exitimp")
    err = fail_line(capsys, "ls", "models")
    assert "plugin exitimp" in err and "SystemExit: exit status 3" in err


def test_broken_plugin_from_the_console_script(plugin_dir, workdir):
    (plugin_dir / "broken.py").write_text("def f(:\n")
    r = attnbench("ls", env={"PYTHONPATH": python_path_with(plugin_dir), plugins.PLUGINS_ENV: "broken"}, timeout=120)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "plugin broken" in r.stderr and "SyntaxError" in r.stderr


def test_taken_names_are_refused_naming_both_owners(isolated, workdir, capsys, monkeypatch):
    code = 'from attnbench.models.attention import Capabilities, ProjectedAttention, register_attention\n' \
           '@register_attention("{name}", paper="p", equation="e")\nclass A(ProjectedAttention):\n    """A."""\n'
    (isolated / "dup_builtin.py").write_text(code.format(name="softmax"))
    monkeypatch.setenv(plugins.PLUGINS_ENV, "dup_builtin")
    err = fail_line(capsys, "ls", "models")
    assert "attention 'softmax'" in err and "attnbench.models.attention.softmax" in err and "dup_builtin" in err

    (isolated / "first_mod.py").write_text(code.format(name="mine"))
    (isolated / "second_mod.py").write_text(code.format(name="mine"))
    monkeypatch.setenv(plugins.PLUGINS_ENV, "first_mod,second_mod")
    err = fail_line(capsys, "ls")
    assert "attention 'mine' is already registered by first_mod" in err and "second_mod cannot" in err

    (isolated / "dup_task.py").write_text("from bench_cli.core.task import Task\nfrom attnbench.tasks import register_task\n"
                                          "@register_task\nclass Uea(Task):\n    name = 'uea'\n")
    monkeypatch.setenv(plugins.PLUGINS_ENV, "dup_task")
    err = fail_line(capsys, "ls")
    assert "task 'uea' is already registered by attnbench.tasks.uea" in err and "dup_task cannot" in err


def test_yaml_error_in_a_user_folder_is_one_line_naming_the_file(isolated, tmp_path, workdir, capsys):
    folder = tmp_path / "badconf"
    (folder / "model").mkdir(parents=True)
    (folder / "model" / "bad.yaml").write_text("name: bad\nattention:\n  name: softmax\n   dropout: 0.0\n")
    err = fail_line(capsys, "validate", "--config-dir", str(folder), "model=bad")
    assert str(folder / "model" / "bad.yaml") in err and "line 4" in err
    err = fail_line(capsys, "ls", "models", "--config-dir", str(folder))
    assert str(folder / "model" / "bad.yaml") in err
    err = fail_line(capsys, "run", "--config-dir", str(tmp_path / "nowhere"))
    assert "--config-dir" in err and "nowhere" in err


# --- records ------------------------------------------------------------------------------------
def test_empty_plugins_key_keeps_job_keys_and_a_plugin_changes_them(workdir):
    from omegaconf import open_dict

    cfg = compose.compose(["task.dataset=Fixture"])
    with_key = job_key(cfg)
    with open_dict(cfg):
        del cfg["plugins"]
    assert job_key(cfg) == with_key  # earlier records (no plugins key) still count as done
    with open_dict(cfg):
        cfg.plugins = ["mymod"]
    assert job_key(cfg) != with_key



@pytest.mark.parametrize("overrides, model", [(["model=softmax", "model.attention.name=linear"], "linear"),
                                              (["model=softmax"], "softmax"), (["model=primalformer"], "primalformer"),
                                              (["model=primal_plus"], "primal_plus"),
                                              (["model=primalformer", "model.attention.name=softmax"], "softmax")])
def test_the_model_column_names_the_attention_that_replaced_the_presets(workdir, overrides, model):
    """A run that swaps its preset's attention is recorded under the attention run (a preset whose
    attention has another name, primalformer's primal, keeps its name); its job key is the config's."""
    from bench_cli.results import schema

    cfg = compose.compose(["task.dataset=Fixture", *overrides])
    key = job_key(cfg)
    assert schema.model_name(cfg) == model and job_key(cfg) == key


# --- a checkpoint names plugins, it never imports them ---------------------------------------------
def test_evaluate_imports_no_module_a_checkpoint_names_and_asks_for_the_plugin_it_was_made_with(
        uea_fixture, isolated, workdir, capsys, monkeypatch):
    """A checkpoint is data: its stored config's ``plugins`` (here the standard library's ``this``,
    which prints the Zen of Python when imported) are never imported by `evaluate`; the plugins the
    run was made with are recorded by name, and evaluating without them is one line naming them."""
    import torch

    from attnbench.models.attention import registry

    monkeypatch.setenv(plugins.PLUGINS_ENV, "mymod")
    main(["run", *TINY, "model.attention.name=elu_linear", "results.path=res.csv", "trainer.checkpoint.keep_final=true"])
    (path,) = Path(read_records("res.csv")[-1]["checkpoint_dir"]).glob("ckpt-*.pt")
    assert torch.load(path, weights_only=True)["meta"]["plugins"] == ["mymod"]
    # a later process, without the plugin
    monkeypatch.delenv(plugins.PLUGINS_ENV)
    registry.ATTENTIONS.forget("elu_linear")
    plugins._LOADED.clear()
    sys.modules.pop("mymod")
    capsys.readouterr()
    err = fail_line(capsys, "evaluate", str(path))
    assert "was made with plugin mymod" in err and "ATTNBENCH_PLUGINS=mymod" in err and "elu_linear" in err
    assert "mymod" not in sys.modules

    state = torch.load(path, weights_only=True)
    state["meta"]["config"]["plugins"] = ["this"]
    torch.save(state, path)
    sys.modules.pop("this", None)
    err = fail_line(capsys, "evaluate", str(path))
    assert "this" not in sys.modules and "Beautiful is better" not in err
    assert "was made with plugin mymod, this" in err
    main(["evaluate", str(path), "plugins=[mymod]"])  # named by the user: imported, and the run's model builds
    out = capsys.readouterr().out
    assert "accuracy" in out and "Beautiful is better" not in out and "this" not in sys.modules
