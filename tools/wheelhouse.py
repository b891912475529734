"""A wheelhouse for installing attnbench on an offline node beside the torch it already has.

On the compute node (offline), in the environment that has torch:
    python tools/keep_torch.py > keep-torch.txt
    python tools/wheelhouse.py inventory > compute-node.json
On a login node (online; the same Python X.Y and machine):
    python tools/wheelhouse.py build compute-node.json -d wheelhouse -c keep-torch.txt '.[vision,rl,text]'
Back on the compute node:
    pip install --no-index --find-links wheelhouse -c keep-torch.txt -e '.[vision,rl,text]'

Why not a plain `pip download '.[...]'`: it resolves as if nothing were installed, so it fetches torch
(and with PyPI's CUDA torch, gigabytes of nvidia-* wheels) that the node has. Instead `build` plans
the install in a throwaway environment that holds stand-ins of the node's distributions (name,
version, dependencies: the inventory) and runs pip's own resolver there (`pip --python ENV install
--dry-run --report`), so the plan is what pip on the node will do: it keeps what the node has and
lists only what is missing. Those are fetched with `pip wheel` (sdists are built here, so the node
builds nothing but attnbench), with the project's build requirements (an offline `pip install -e .`
builds it in an isolated environment that can only take them from the wheelhouse). Standard library
only; needs pip 22.3+ (--python).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import venv
from importlib import metadata
from pathlib import Path

from keep_torch import KEPT

FIELDS = ("Name", "Version", "Requires-Python", "Requires-Dist", "Provides-Extra")  # what pip reads of an installed one
MULTI = {"Requires-Dist", "Provides-Extra"}
LEGACY_MANYLINUX = {"manylinux1": (2, 5), "manylinux2010": (2, 12), "manylinux2014": (2, 17)}
DEFAULT_BUILD_REQUIRES = ["setuptools>=40.8.0"]  # pip's own default for a project without [build-system]


class WheelhouseError(Exception):
    """One line for the user; exit status 2."""


def canonical(name: str) -> str:
    """PEP 503's normalised name: `Typing_Extensions` -> `typing-extensions`."""
    return re.sub(r"[-_.]+", "-", name).lower()


# --- inventory: on the compute node ------------------------------------------------------------------
def this_machine() -> dict:
    libc, libc_version = platform.libc_ver()
    return {"python": f"{sys.version_info[0]}.{sys.version_info[1]}", "machine": platform.machine(),
            "glibc": libc_version if libc == "glibc" else None}


def inventory() -> dict:
    """This Python's installed distributions (the first of a name on sys.path, as import finds it)."""
    found: dict[str, dict] = {}
    for dist in metadata.distributions():
        meta = dist.metadata
        if meta["Name"] and canonical(meta["Name"]) not in found:
            found[canonical(meta["Name"])] = {k: (meta.get_all(k) or []) if k in MULTI else meta[k]
                                              for k in FIELDS if k in MULTI or meta[k]}
    return {**this_machine(), "distributions": [found[k] for k in sorted(found)]}


# --- build: on the login node ------------------------------------------------------------------------
def check_same_machine(node: dict) -> None:
    here = this_machine()
    for key in ("python", "machine"):
        if node[key] != here[key]:
            raise WheelhouseError(f"the compute node has {key} {node[key]}, this one {here[key]}: run build with "
                                  f"the node's Python {node['python']} on {node['machine']} (wheels are built for it)")


def write_stand_ins(site_packages: Path, distributions: list[dict]) -> None:
    """A `NAME-VERSION.dist-info/METADATA` of each: what pip reads to decide what is installed."""
    for dist in distributions:
        folder = site_packages / f"{canonical(dist['Name']).replace('-', '_')}-{dist['Version']}.dist-info"
        folder.mkdir(parents=True)
        lines = ["Metadata-Version: 2.1"]
        for key in FIELDS:
            values = dist.get(key) if key in MULTI else [dist[key]] if dist.get(key) else []
            lines += [f"{key}: {v}" for v in values or []]
        (folder / "METADATA").write_text("\n".join(lines) + "\n")
        (folder / "INSTALLER").write_text("wheelhouse-stand-in\n")


def stand_in_environment(where: Path, distributions: list[dict]) -> str:
    """A bare virtual environment holding stand-ins of ``distributions``; returns its python."""
    venv.create(where, with_pip=False, symlinks=os.name != "nt")
    python = str(where / ("Scripts/python.exe" if os.name == "nt" else "bin/python"))
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    write_stand_ins(Path(site), distributions)
    return python


def wheels_to_fetch(report: dict, node: dict) -> list[str]:
    """`name==version` of what the plan installs (the local project itself is not fetched); a plan
    that would replace the node's torch or torchvision stops here, before gigabytes are fetched."""
    have = {canonical(d["Name"]): d["Version"] for d in node["distributions"]}
    fetch = []
    for item in report["install"]:
        name, version = item["metadata"]["name"], item["metadata"]["version"]
        if "dir_info" in item.get("download_info", {}):
            continue
        old = have.get(canonical(name))
        if canonical(name) in KEPT and old:
            raise WheelhouseError(f"the plan replaces the compute node's {name} {old} with {version}: pass "
                                  "-c keep-torch.txt (python tools/keep_torch.py on the node writes it)")
        if old:
            print(f"wheelhouse: the node's {name} {old} is replaced by {version}", file=sys.stderr)
        fetch.append(f"{name}=={version}")
    return fetch


def build_requirements(requirements: list[str]) -> list[str]:
    """[build-system].requires of each local project among ``requirements`` (`.[vision]`, `path/to/it`)."""
    out = []
    for requirement in requirements:
        project = Path(requirement.split("[", 1)[0])
        if not (project / "pyproject.toml").is_file() and not (project / "setup.py").is_file():
            continue
        try:
            import tomllib
        except ModuleNotFoundError:  # Python 3.10: pip carries tomli
            from pip._vendor import tomli as tomllib
        pyproject = project / "pyproject.toml"
        table = tomllib.loads(pyproject.read_text()).get("build-system", {}) if pyproject.is_file() else {}
        out += table.get("requires", DEFAULT_BUILD_REQUIRES)
    return out


def glibc_needed(wheel: str) -> tuple[int, int] | None:
    """The oldest glibc a wheel runs on, from its platform tags (None: no glibc wheel: pure, musl...)."""
    needs = []
    for tag in wheel[:-len(".whl")].split("-")[-1].split("."):
        match = re.match(r"manylinux_(\d+)_(\d+)_", tag)
        legacy = LEGACY_MANYLINUX.get(tag.split("_", 1)[0])
        if match or legacy:
            needs.append((int(match[1]), int(match[2])) if match else legacy)
    return min(needs) if needs else None


def too_new_for(glibc: str | None, wheels: list[str]) -> list[str]:
    """The wheels that need a newer glibc than the node's (``glibc`` "2.28"; None: not checked)."""
    if not glibc:
        return []
    have = tuple(int(x) for x in glibc.split(".")[:2])
    return [w for w in wheels if (glibc_needed(w) or (0, 0)) > have]


def pip(*args: str) -> None:
    done = subprocess.run([sys.executable, "-m", "pip", *args])
    if done.returncode:
        raise WheelhouseError(f"pip {args[0]} failed (exit {done.returncode}): its messages are above")


def build(inventory_file: Path, dest: Path, requirements: list[str], constraints: list[str]) -> None:
    node = json.loads(inventory_file.read_text())
    check_same_machine(node)
    pip_version = tuple(int(x) for x in re.findall(r"\d+", metadata.version("pip"))[:2])
    if pip_version < (22, 3):
        raise WheelhouseError(f"pip {metadata.version('pip')} cannot plan for another environment: pip install -U pip")
    with tempfile.TemporaryDirectory(prefix="wheelhouse-") as tmp:
        python = stand_in_environment(Path(tmp) / "node", node["distributions"])
        report = Path(tmp) / "plan.json"
        pip("--python", python, "install", "--dry-run", "--quiet", "--report", str(report),
            *(f"--constraint={c}" for c in constraints), *requirements)
        fetch = wheels_to_fetch(json.loads(report.read_text()), node)
        listed = Path(tmp) / "fetch.txt"
        listed.write_text("".join(f"{line}\n" for line in fetch))
        dest.mkdir(parents=True, exist_ok=True)
        if fetch:
            pip("wheel", "--quiet", "--no-deps", "--wheel-dir", str(dest), "--requirement", str(listed))
    builders = build_requirements(requirements)
    if builders:
        pip("wheel", "--quiet", "--wheel-dir", str(dest), *builders)
    wheels = sorted(p.name for p in dest.glob("*.whl"))
    unfit = too_new_for(node.get("glibc"), wheels)
    if unfit:
        raise WheelhouseError(f"these need a newer glibc than the node's {node['glibc']}: {', '.join(unfit)}")
    size = sum((dest / w).stat().st_size for w in wheels) / 2**20
    kept = [f"{d['Name']} {d['Version']}" for d in node["distributions"] if canonical(d["Name"]) in KEPT]
    print(f"wheelhouse: {len(fetch)} wheels planned, {len(wheels)} in {dest} ({size:.0f} MiB) for Python "
          f"{node['python']} on {node['machine']}; the node's own {', '.join(kept) or 'torch'} not fetched")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="wheelhouse.py", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("inventory", help="print this environment's distributions (JSON), on the compute node")
    b = commands.add_parser("build", help="fetch what the inventoried node lacks, on a login node")
    b.add_argument("inventory", type=Path, help="the compute node's `inventory` output")
    b.add_argument("requirements", nargs="+", help="what the node will install, e.g. '.[vision,rl,text]'")
    b.add_argument("-d", "--dest", type=Path, required=True, help="the wheelhouse folder")
    b.add_argument("-c", "--constraint", action="append", default=[], help="constraints file (keep-torch.txt)")
    args = parser.parse_args(argv)
    try:
        if args.command == "inventory":
            print(json.dumps(inventory(), indent=1))
        else:
            build(args.inventory, args.dest, args.requirements, args.constraint)
    except WheelhouseError as e:
        print(f"wheelhouse: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
