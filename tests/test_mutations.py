"""The suite still fails when the trainer or the statistics are broken (issue 34).

Each case copies the project's packages and tests into a temporary folder, breaks one thing in the
copy's source (an optimiser step that does nothing, the selected weights not reloaded before the
reported test evaluation, Student's pooled t in place of Welch's) and runs the tests that guard it
against the copy: they must fail. A guard that still passed against a broken copy would be a test
that cannot fail. The unbroken source is what the rest of the suite runs, so each guard is known to
pass there."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
COPIED = ("bench_cli", "tasks", "models", "conf", "tests", "pyproject.toml")

# (file, the source as it is, the broken source, the tests that must then fail)
MUTATIONS = {
    "no-op optimiser step": ("bench_cli/engine/trainer.py", "self.scaler.step(opt)", "pass  # mutated: no update",
                             ["tests/test_trainer_fit.py::test_holdout_reports_the_test_metrics_of_the_selected_weights"]),
    "selected weights not reloaded": ("bench_cli/engine/trainer.py", "self.model.load_state_dict(selection.state)",
                                      "pass  # mutated: the last weights stay",
                                      ["tests/test_trainer_fit.py::test_holdout_reports_the_test_metrics_of_the_selected_weights"]),
    "Student's t for Welch's": ("bench_cli/results/report/stats.py", "equal_var=False", "equal_var=True",
                                ["tests/test_report.py::test_welch_and_tolerance"]),
}


def broken_copy(tmp: Path, file: str, before: str, after: str) -> Path:
    for name in COPIED:
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, tmp / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(src, tmp / name)
    target = tmp / file
    source = target.read_text()
    # the guard must know the code it breaks: a refactor that renames it fails here, not silently
    assert source.count(before) >= 1, f"{file} no longer contains {before!r}: update this mutation"
    target.write_text(source.replace(before, after))
    return tmp


@pytest.mark.parametrize("name", list(MUTATIONS))
def test_the_guarding_tests_fail_against_a_broken_copy(name, tmp_path):
    file, before, after, guards = MUTATIONS[name]
    copy = broken_copy(tmp_path / "src", file, before, after)
    env = {**os.environ, "PYTHONPATH": str(copy)}
    where = subprocess.run([sys.executable, "-c", "import bench_cli; print(bench_cli.__file__)"],
                           cwd=copy, env=env, capture_output=True, text=True, check=True).stdout
    assert where.startswith(str(copy)), f"the copy is not what runs: {where}"
    done = subprocess.run([sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                           *guards], cwd=copy, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 1 and " failed" in done.stdout, \
        f"{name}: the guarding tests passed against the broken copy:\n{done.stdout[-2000:]}"
