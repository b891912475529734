"""Print pip constraints that keep the torch (and torchvision) this Python already has.

    python tools/keep_torch.py > keep-torch.txt
    pip install -c keep-torch.txt -e '.[all]'

Each line is `NAME==X.Y.Z`: the installed distribution's version (its metadata, what pip compares),
without a local label. Two reasons, both seen with pip 26 (docs/gpu.md):
- PyPI's CUDA wheels install as `2.11.0` while `torch.__version__` says `2.11.0+cu130`; a constraint
  written from `torch.__version__` matches no installed or indexed torch, and pip stops with
  ResolutionImpossible ("The user requested (constraint) torch==2.11.0+cu130").
- PEP 440: `==2.13.0` matches `2.13.0+cpu` and `2.13.0+cu130`, so the line keeps a build whose label
  no index at hand serves (a wheelhouse, PyPI) without naming it.
Standard library only: it runs before attnbench (or anything else) is installed.
"""
from __future__ import annotations

import sys
from importlib import metadata

KEPT = ("torch", "torchvision")  # torchvision pins the exact torch it was built for


def release(version: str) -> str:
    """The version without its local label: `2.13.0+cpu` -> `2.13.0` (PEP 440 local version)."""
    return version.split("+", 1)[0]


def constraint_lines(installed: dict[str, str | None]) -> list[str]:
    """`NAME==release` for each of KEPT that is installed (version not None), in KEPT's order."""
    return [f"{name}=={release(installed[name])}" for name in KEPT if installed.get(name)]


def installed_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def main() -> int:
    lines = constraint_lines({name: installed_version(name) for name in KEPT})
    if not lines:
        print(f"keep_torch: no torch installed in {sys.executable}: nothing to keep "
              "(activate the environment that has it, or install attnbench without -c)", file=sys.stderr)
        return 2
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
