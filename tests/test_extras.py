"""Optional extras (a family's heavy dependencies installed only by those who run it): the core runs
without any of them, and a family whose extra is missing is one line naming it (`pip install
'attnbench[vision]'`), exit status 2."""
from __future__ import annotations

import json
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

# Runs the CLI's commands (a JSON list of argument lists) one after the other in one fresh process
# with the named top-level modules made unimportable, as in an environment where their extra was not
# installed (a meta path finder refusing them, before anything imports). After each command, its exit
# status on stdout and a separator on both streams.
BLOCKED_MAIN = """
import json, sys
from importlib.abc import MetaPathFinder
blocked = set(sys.argv[1].split(","))

class Blocker(MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in blocked:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, Blocker())
from bench_cli.commands.cli import main
for args in json.loads(sys.argv[2]):
    try:
        main(args)
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else int(e.code is not None)
    print(f"exit status {code}", flush=True)
    for stream in (sys.stdout, sys.stderr):
        print(sys.argv[3], file=stream, flush=True)
"""
SEPARATOR = "--- the next command ---"
COMMANDS = {"ls": ["ls"], "validate uea": ["validate", "task.dataset=BasicMotions"],
            "validate vit": ["validate", "task=vit", "task.dataset=mnist5k"]}


@pytest.fixture(scope="module")
def without_extras(tmp_path_factory) -> dict[str, tuple[int, str, str]]:
    """{command: (exit status, stdout, stderr)} of COMMANDS run in one process where no module of any
    extra is importable (one process: each costs seconds of imports)."""
    workdir = tmp_path_factory.mktemp("without_extras")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "ATTNBENCH_DATA": str(workdir / "data"),
           "ATTNBENCH_OUTPUT": str(workdir / "outputs")}
    done = subprocess.run([sys.executable, "-c", BLOCKED_MAIN, ",".join(sum(EXTRA_MODULES.values(), [])),
                           json.dumps(list(COMMANDS.values())), SEPARATOR], capture_output=True, text=True,
                          timeout=120, cwd=workdir, env=env)
    outs, errs = done.stdout.split(SEPARATOR + "\n"), done.stderr.split(SEPARATOR + "\n")
    assert done.returncode == 0 and len(outs) == len(errs) == len(COMMANDS) + 1, done.stdout + done.stderr
    results = {}
    for name, out, err in zip(COMMANDS, outs, errs):
        *lines, status = out.rstrip("\n").splitlines()
        results[name] = (int(status.removeprefix("exit status ")), "\n".join(lines), err)
    return results


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
