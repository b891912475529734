"""The suite's own clock (tests/durations.py): a test over the per-test limit fails with the reason,
and the record of a run says where the CPU went, per file and per test."""
from __future__ import annotations

from pathlib import Path

import durations

pytest_plugins = ["pytester"]

SLOW_AND_FAST = """
import time

def test_slow():
    time.sleep(1.0)

def test_fast():
    pass
"""
WITH_A_CHILD = """
import time, subprocess, sys

def test_sleeps():
    time.sleep(0.3)

def test_starts_a_child():
    subprocess.run([sys.executable, "-c", "sum(range(10**6))"], check=True)
"""

WITH_A_LIVE_CHILD = """
import subprocess, sys, time
from pathlib import Path

BUSY = "import sys, time\\nt = time.process_time()\\nwhile time.process_time() - t < 0.5: pass\\n" \\
       "open(sys.argv[1], 'w').close()\\ntime.sleep(60)"
children = []

def test_starts_a_busy_child_it_does_not_wait_for(tmp_path):
    children.append(subprocess.Popen([sys.executable, "-c", BUSY, str(tmp_path / "busy")]))
    while not (tmp_path / "busy").exists():  # then it sleeps, alive past this test
        time.sleep(0.05)

def test_ends_it():
    children[0].kill()
    children[0].wait()
"""


def run_with_the_plugin(pytester, monkeypatch, tests: str, limit: float, record: Path | None = None,
                        own_process: bool = True):
    pytester.makeconftest(f"import sys; sys.path.insert(0, {str(Path(durations.__file__).parent)!r})\n"
                          "from durations import install\n"
                          "def pytest_configure(config):\n    install(config)\n")
    pytester.makepyfile(test_timed=tests)
    monkeypatch.setenv(durations.LIMIT_ENV, str(limit))
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    if record is not None:
        monkeypatch.setenv(durations.RECORD_ENV, str(record))
    else:
        monkeypatch.delenv(durations.RECORD_ENV, raising=False)
    # in a process of its own where child CPU is read: the children this process has (a forkserver,
    # joblib's workers left by earlier tests) would count in the inner tests' child CPU
    run = pytester.runpytest_subprocess if own_process else pytester.runpytest_inprocess
    return run("-p", "no:cacheprovider", "-p", "no:xdist")


def test_a_test_over_the_limit_fails_naming_its_time_and_the_limit(pytester, monkeypatch):
    result = run_with_the_plugin(pytester, monkeypatch, SLOW_AND_FAST, limit=0.5, own_process=False)
    result.assert_outcomes(passed=1, failed=1)
    text = result.stdout.str()
    assert "test_timed.py::test_slow: its call took 1.0 s, over the 0.5 s limit for one test" in text
    assert "make test-durations" in text


def test_under_the_limit_nothing_fails_and_the_record_counts_child_cpu(pytester, monkeypatch, tmp_path):
    prefix = tmp_path / "run"
    run_with_the_plugin(pytester, monkeypatch, WITH_A_CHILD, limit=20, record=prefix).assert_outcomes(passed=2)
    rows = {row["test"]: row for row in durations.read_lines(prefix)}
    assert set(rows) == {"test_timed.py::test_sleeps", "test_timed.py::test_starts_a_child"}
    assert rows["test_timed.py::test_sleeps"]["wall_s"] >= 0.3 > rows["test_timed.py::test_sleeps"]["cpu_s"]
    assert rows["test_timed.py::test_starts_a_child"]["cpu_s"] > 0.02  # the child's interpreter and its sum
    child = rows["test_timed.py::test_starts_a_child"]["child_cpu_s"]
    assert 0.02 < child <= rows["test_timed.py::test_starts_a_child"]["cpu_s"]
    assert rows["test_timed.py::test_sleeps"]["child_cpu_s"] == 0
    table = durations.report(list(rows.values()))
    assert "test_timed.py" in table and "test_starts_a_child" in table and f"({child:.1f} in children)" in table
    assert all(len(line) <= 80 for line in table.splitlines())


def test_a_child_that_outlives_its_test_is_counted_in_that_test(pytester, monkeypatch, tmp_path):
    """A forkserver or a joblib worker works for a test and is reaped later: its CPU goes to the test
    it worked for, not to the one that reaps it."""
    prefix = tmp_path / "run"
    run_with_the_plugin(pytester, monkeypatch, WITH_A_LIVE_CHILD, limit=20, record=prefix).assert_outcomes(passed=2)
    rows = {row["test"].split("::")[1]: row for row in durations.read_lines(prefix)}
    assert rows["test_starts_a_busy_child_it_does_not_wait_for"]["child_cpu_s"] >= 0.45
    assert rows["test_ends_it"]["child_cpu_s"] < 0.2
