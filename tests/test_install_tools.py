"""Installing beside an existing torch (docs/gpu.md): the constraint docs/gpu.md writes keeps the
installed torch."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import keep_torch  # noqa: E402 - tools/ is not a package: its scripts run before attnbench is installed

GPU_DOC = ROOT / "docs/gpu.md"


def fake_install(site: Path, name: str, version: str, reported: str) -> None:
    """A distribution ``name`` installed as ``version`` whose module says ``__version__ = reported``
    (PyPI's CUDA torch: installed as 2.11.0, reporting 2.11.0+cu130)."""
    (site / name).mkdir(parents=True)
    (site / name / "__init__.py").write_text(f"__version__ = {reported!r}\n")
    (site / f"{name}-{version}.dist-info").mkdir()
    (site / f"{name}-{version}.dist-info/METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")


def keep_commands() -> list[str]:
    commands = re.findall(r"^(python .*?) > keep-torch\.txt", GPU_DOC.read_text(), re.M)
    assert commands, "docs/gpu.md writes no keep-torch.txt"
    return commands


@pytest.mark.parametrize("installed", [
    {"torch": ("2.11.0", "2.11.0+cu130")},  # PyPI's CUDA wheels
    {"torch": ("2.13.0+cpu", "2.13.0+cpu"), "torchvision": ("0.28.0+cpu", "0.28.0+cpu")},  # PyTorch's index
    {"torch": ("2.11.0", "2.11.0+cu130"), "torchvision": ("0.26.0", "0.26.0+cu130")},
], ids=["pypi-cuda", "label-cpu", "pypi-cuda-torchvision"])
def test_the_docs_constraint_keeps_the_installed_torch_without_its_label(installed, tmp_path):
    """The docs' command, run over a fake torch: each line matches the installed version (what pip
    compares: an installed 2.11.0 is not `==2.11.0+cu130`) and names no local label (an index or a
    wheelhouse that does not serve that build could not satisfy it otherwise)."""
    for name, (version, reported) in installed.items():
        fake_install(tmp_path / "site", name, version, reported)
    (tmp_path / "bin").mkdir()
    os.symlink(sys.executable, tmp_path / "bin/python")
    env = {**os.environ, "PATH": f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}", "PYTHONPATH": str(tmp_path / "site")}
    for command in keep_commands():
        out = subprocess.run(["bash", "-c", command], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, f"{command}: {out.stderr}"
        lines = [Requirement(line) for line in out.stdout.split()]
        assert {r.name for r in lines} == set(installed), f"{command}: {out.stdout}"
        for r in lines:
            assert r.specifier.contains(installed[r.name][0], prereleases=True), f"{command}: {r} misses {installed[r.name][0]}"
            assert "+" not in str(r.specifier), f"{command}: {r} names a local label"


def test_keep_torch_without_torch_is_one_line_and_exit_2(monkeypatch, capsys):
    monkeypatch.setattr(keep_torch, "installed_version", lambda name: None)
    assert keep_torch.main() == 2
    out = capsys.readouterr()
    assert out.out == "" and len(out.err.strip().splitlines()) == 1 and "no torch installed" in out.err
