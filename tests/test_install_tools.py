"""Installing beside an existing torch (docs/gpu.md): the constraint docs/gpu.md writes keeps the
installed torch, and tools/wheelhouse.py's pieces (the node's stand-ins, what a plan fetches, which
wheels the node's glibc runs). The install itself, online and offline, is `make check-install`
(minutes: tools/check_install.sh)."""
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
import wheelhouse  # noqa: E402

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


def test_stand_ins_read_back_as_the_inventoried_distributions(tmp_path):
    """What pip reads of an installed distribution: name, version, dependencies, extras."""
    node = wheelhouse.inventory()
    wanted = [d for d in node["distributions"] if wheelhouse.canonical(d["Name"]) in ("torch", "numpy", "hydra-core")]
    assert len(wanted) == 3
    wheelhouse.write_stand_ins(tmp_path, wanted)
    back = {wheelhouse.canonical(d.metadata["Name"]): d for d in metadata.distributions(path=[str(tmp_path)])}
    for dist in wanted:
        again = back[wheelhouse.canonical(dist["Name"])]
        assert again.version == dist["Version"] == metadata.version(dist["Name"])
        assert (again.requires or []) == dist["Requires-Dist"] == (metadata.requires(dist["Name"]) or [])
        assert (again.metadata.get_all("Provides-Extra") or []) == dist["Provides-Extra"]


def test_a_stand_in_of_a_bare_distribution_says_only_its_name_and_version(tmp_path):
    wheelhouse.write_stand_ins(tmp_path, [{"Name": "bare", "Version": "1.0+local"}])
    (bare,) = metadata.distributions(path=[str(tmp_path)])
    assert bare.version == "1.0+local" and bare.requires is None
    assert set(bare.metadata.keys()) == {"Metadata-Version", "Name", "Version"}


NODE = {"python": "3.11", "machine": "x86_64", "glibc": "2.28",
        "distributions": [{"Name": "torch", "Version": "2.13.0+cpu"}, {"Name": "NumPy", "Version": "1.26.4"}]}


def planned(name: str, version: str, **download_info) -> dict:
    return {"metadata": {"name": name, "version": version},
            "download_info": download_info or {"url": f"https://files/{name}-{version}.whl", "archive_info": {}}}


def test_the_plan_fetches_what_it_installs_but_not_the_project(capsys):
    report = {"install": [planned("attnbench", "0.1.0", url="file:///src", dir_info={"editable": False}),
                          planned("timm", "1.0.31"), planned("numpy", "2.4.6")]}
    assert wheelhouse.wheels_to_fetch(report, NODE) == ["timm==1.0.31", "numpy==2.4.6"]
    assert "the node's numpy 1.26.4 is replaced by 2.4.6" in capsys.readouterr().err


def test_a_plan_that_replaces_the_nodes_torch_stops_before_fetching():
    report = {"install": [planned("torchvision", "0.29.1"), planned("torch", "2.14.1")]}
    with pytest.raises(wheelhouse.WheelhouseError, match=r"replaces the compute node's torch 2.13.0\+cpu .*keep-torch.txt"):
        wheelhouse.wheels_to_fetch(report, NODE)


def test_wheels_for_a_newer_glibc_than_the_nodes_are_named():
    wheels = ["numpy-2.4.6-cp311-cp311-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl",  # 2.27 at least
              "h5py-3.16.0-cp311-cp311-manylinux_2_34_x86_64.whl",
              "pyyaml-6.0.4-cp311-cp311-manylinux2014_x86_64.manylinux_2_17_x86_64.whl",
              "websockets-17.4-cp311-cp311-manylinux1_x86_64.manylinux_2_5_x86_64.whl",
              "timm-1.0.31-py3-none-any.whl"]
    assert wheelhouse.too_new_for("2.28", wheels) == ["h5py-3.16.0-cp311-cp311-manylinux_2_34_x86_64.whl"]
    assert wheelhouse.too_new_for("2.17", wheels) == wheels[:2]
    assert wheelhouse.too_new_for(None, wheels) == []  # a musl or unknown libc: not checked


def test_build_refuses_another_python_in_one_line(tmp_path, capsys):
    (tmp_path / "node.json").write_text('{"python": "2.7", "machine": "x86_64", "glibc": null, "distributions": []}')
    assert wheelhouse.main(["build", str(tmp_path / "node.json"), "-d", str(tmp_path / "wh"), "."]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "python 2.7" in err and not (tmp_path / "wh").exists()


def test_build_requirements_are_the_projects_build_system():
    assert wheelhouse.build_requirements([f"{ROOT}[vision,rl,text]", "numpy>=2"]) == ["setuptools>=64"]


def test_uv_is_pointed_at_the_sources_pip_is_configured_with():
    """`make install` runs uv with pip's package sources (tools/pip_sources.py): the find-links folder
    holding this machine's CPU torch, the local indexes, the constraints file, every index alike."""
    import pip_sources

    listed = ("global.extra-index-url='file:///opt/a/simple file:///opt/b/simple'\n"
              "global.find-links='/opt/wheels'\n"
              "global.constraint='/etc/xdg/pip/constraints.txt'\n"
              "global.index-url='https://mirror.example/simple'\n"
              ":env:.index-url='https://env.example/simple'\n"
              ":env:.default-timeout='180'\n")
    env = pip_sources.uv_environment(pip_sources.pip_settings(listed))
    assert env == {"UV_INDEX_STRATEGY": "unsafe-best-match",
                   "UV_DEFAULT_INDEX": "https://env.example/simple",  # PIP_INDEX_URL wins over the file
                   "UV_EXTRA_INDEX_URL": "file:///opt/a/simple file:///opt/b/simple",
                   "UV_FIND_LINKS": "/opt/wheels", "UV_CONSTRAINT": "/etc/xdg/pip/constraints.txt"}
    assert pip_sources.uv_environment(pip_sources.pip_settings("")) == {"UV_INDEX_STRATEGY": "unsafe-best-match"}
    assert pip_sources.uv_environment({"no-index": "true"})["UV_NO_INDEX"] == "1"
