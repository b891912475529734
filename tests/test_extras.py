"""Optional extras (a family's heavy dependencies installed only by those who run it): the core runs
without any of them, and a family whose extra is missing is one line naming it (`pip install
'attnbench[vision]'`), exit status 2."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from bench_cli.core.extras import MissingExtraError, require
from conftest import commands_in_one_process

ROOT = Path(__file__).resolve().parents[1]

# Every module an extra provides, by extra (the packages of pyproject.toml's extras, as imported).
EXTRA_MODULES = {"vision": ["torchvision", "timm", "mlxtend"], "rl": ["h5py", "gymnasium", "mujoco"],
                 "text": ["datasets", "sacrebleu"], "wandb": ["wandb"], "tensorboard": ["tensorboard"],
                 "bench": ["transformers"], "tune": ["optuna"]}

# Makes the top-level modules named in `blocked` unimportable, as in an environment where their extra
# was not installed (a meta path finder refusing them, before anything imports).
BLOCKER = """
import sys
from importlib.abc import MetaPathFinder

class Blocker(MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in blocked:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, Blocker())
"""
COMMANDS = {"ls": ["ls"], "validate uea": ["validate", "task.dataset=BasicMotions"],
            "validate vit": ["validate", "task=vit", "task.dataset=mnist5k"],
            "optuna sweep": ["sweep", "task.dataset=BasicMotions", "hydra/sweeper=optuna",
                             "task.backbone.dropout=interval(0,0.3)", "--dry-run"]}


@pytest.fixture(scope="module")
def without_extras(tmp_path_factory) -> dict[str, tuple[int, str, str]]:
    """{command: (exit status, stdout, stderr)} of COMMANDS, run in one process where no module of any
    extra is importable."""
    workdir = tmp_path_factory.mktemp("without_extras")
    prelude = f"blocked = {set(sum(EXTRA_MODULES.values(), []))!r}\n" + BLOCKER
    env = {"PYTHONPATH": str(ROOT), "ATTNBENCH_DATA": str(workdir / "data"), "ATTNBENCH_OUTPUT": str(workdir / "outputs")}
    done = commands_in_one_process(list(COMMANDS.values()), prelude, env, cwd=workdir)
    return dict(zip(COMMANDS, done))


def test_pyproject_pins_no_torch_and_names_every_extra():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pinned = [d for d in project["dependencies"] + sum(project["optional-dependencies"].values(), [])
              if "==" in d]
    assert pinned == []  # ranges only: a GPU machine keeps its own torch
    extras = project["optional-dependencies"]
    assert set(EXTRA_MODULES) | {"all", "test"} == set(extras)
    assert not any(d.startswith(("torchvision", "timm", "h5py", "gymnasium", "datasets", "wandb", "tensorboard"))
                   for d in project["dependencies"])


def test_require_names_the_extra():
    with pytest.raises(MissingExtraError) as e:
        require("attnbench_no_such_module.sub", "vision", "task=vit")
    assert str(e.value) == ("task=vit needs attnbench_no_such_module, which is not installed: "
                            "pip install 'attnbench[vision]'")
    assert e.value.exit_code == 2


def test_missing_h5py_is_one_line_naming_rl(monkeypatch, tmp_path):
    from attnbench.tasks.d4rl.data import read_hdf5

    monkeypatch.setitem(sys.modules, "h5py", None)  # `import h5py` now fails as if not installed
    with pytest.raises(MissingExtraError, match=r"task=d4rl needs h5py, .*pip install 'attnbench\[rl\]'"):
        read_hdf5(tmp_path / "x.hdf5")


def test_missing_sacrebleu_is_one_line_naming_text(monkeypatch):
    from bench_cli.core.metrics import BLEU

    for name in [m for m in sys.modules if m == "sacrebleu" or m.startswith("sacrebleu.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "sacrebleu", None)
    with pytest.raises(MissingExtraError, match=r"BLEU needs sacrebleu, .*attnbench\[text\]"):
        BLEU().update(None, {"hypotheses": ["a"], "references": ["a"]})


@pytest.mark.slow
def test_cli_without_the_vision_extra_is_one_line_exit_2(without_extras):
    """A vision run where torchvision, timm and mlxtend are absent: one line, no traceback."""
    code, _, err = without_extras["validate vit"]
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert "pip install 'attnbench[vision]'" in lines[0]


@pytest.mark.slow
def test_core_cli_runs_without_any_extra(without_extras):
    """`ls` and the default task (UEA, shipped in sktime) need no extra."""
    for name in ("ls", "validate uea"):
        code, out, err = without_extras[name]
        assert code == 0, (name, out, err)


def test_without_the_tune_extra_an_optuna_sweep_is_one_line_naming_it(without_extras):
    code, _, err = without_extras["optuna sweep"]
    assert code == 2 and "Traceback" not in err, err
    assert err.strip() == "error: hydra/sweeper=optuna needs optuna, which is not installed: pip install 'attnbench[tune]'"
