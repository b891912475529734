"""The code passes ruff with the project's configuration (pyproject.toml [tool.ruff]), as `make lint`
checks it: a lint failure fails the suite, so CI keeps the code clean."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_ruff_finds_nothing_with_the_project_configuration():
    ruff = Path(sys.executable).with_name("ruff")
    if not ruff.exists():
        ruff = shutil.which("ruff")
    if ruff is None:
        pytest.fail("ruff is not installed: `make install` installs it with the test extra")
    done = subprocess.run([str(ruff), "check", "--no-cache", "."], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
