"""Where the suite's time goes, and a limit on any one test.

A pytest plugin (loaded by tests/conftest.py) that, for every test:
- fails it when its setup or its call took longer than ``ATTNBENCH_TEST_LIMIT_S`` seconds of wall
  time (20 by default): the whole suite must run in 5 minutes on a 2-core machine, and one slow test
  on one of the two workers is most of the tail. The limit is on each phase, so a session fixture
  that trains a shared model counts once, in the setup of the first test that uses it;
- with ``ATTNBENCH_TEST_DURATIONS=FILE`` set, appends one JSON line per test to ``FILE.<worker>``:
  its wall time (setup + call + teardown), the CPU seconds spent in the test process and in its
  child processes (an `attnbench` command, a pytest of a broken copy, and, counted as they work,
  the long-lived ones: a forkserver and what it forks, joblib's workers), and the children's share
  of them (what a process started once per test costs).

``python tests/durations.py FILE`` (what `make test-durations` runs after the suite) reads those
lines and prints the CPU seconds per test file and the slowest tests (each name whole, on a line
of its own).
"""
from __future__ import annotations

import json
import os
import resource
import sys
import time
from collections import defaultdict
from pathlib import Path

import pytest

LIMIT_ENV, RECORD_ENV = "ATTNBENCH_TEST_LIMIT_S", "ATTNBENCH_TEST_DURATIONS"
# 20 s, as on the earlier machines. On the AVX2-only machine of 2026-11-28 the slowest tests, all
# process-level (submitit's and joblib's worker processes, the mutation checks' pytest: each imports
# torch), took 19-20 s in the morning and 14-18 s early in the evening (25 s was the limit then); after
# the processes that only needed to be processes were forked from a preloaded forkserver or run
# in-process, 14.3-15.4 s at most over three fresh-clone runs that night (runs of one tree vary by up
# to 20% there).
DEFAULT_LIMIT_S = 20.0


def limit_s() -> float:
    return float(os.environ.get(LIMIT_ENV, DEFAULT_LIMIT_S))


def cpu_seconds() -> tuple[float, float]:
    """CPU time (user + system) of this process, and of its waited-for children, so far."""
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time(), children.ru_utime + children.ru_stime


def live_children_cpu() -> dict[int, float]:
    """pid -> CPU seconds so far of each live child process of this one, with the CPU of the
    processes it has reaped itself (/proc/<pid>/stat: utime, stime, cutime, cstime). Children that
    outlive a test (the DDP and command tests' forkserver and what it forks, joblib's loky workers)
    are counted as they work, not when this process reaps them; {} where there is no /proc."""
    me, ticks, found = os.getpid(), os.sysconf("SC_CLK_TCK"), {}
    try:
        pids = [name for name in os.listdir("/proc") if name.isdigit()]
    except OSError:
        return found
    # Listed, then read: a process may end in between (pathlib's glob stats each entry and raised
    # ProcessLookupError for one that had), so each read may fail and is skipped.
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):  # gone meanwhile
            continue
        if int(fields[1]) == me:  # fields after the name: state, ppid, ..., utime (the 12th) to cstime
            found[int(pid)] = sum(int(v) for v in fields[11:15]) / ticks
    return found


def started_processes_cpu(before: dict[int, float], after: dict[int, float], reaped_s: float) -> float:
    """The CPU of child processes between two snapshots: what the waited-for ones used (``reaped_s``,
    from getrusage, whole lives: the part before the first snapshot of a child live then is taken
    off) and what the live ones used meanwhile."""
    gone = sum(cpu for pid, cpu in before.items() if pid not in after)
    return reaped_s - gone + sum(cpu - before.get(pid, 0.0) for pid, cpu in after.items())


class DurationPlugin:
    """The pytest hooks: the per-phase limit, and the per-test record when asked. Hook wrappers of
    the runtest protocol, so they run where the test runs (an xdist worker), never in the controller
    that only relays the workers' reports."""

    def __init__(self, record: Path | None) -> None:
        self.limit, self.record = limit_s(), record

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item, nextitem):
        live = live_children_cpu() if self.record is not None else {}
        wall, (own, children) = time.perf_counter(), cpu_seconds()
        yield
        if self.record is not None:
            own_after, children_after = cpu_seconds()
            started = started_processes_cpu(live, live_children_cpu(), children_after - children)
            line = {"test": item.nodeid, "ended": round(time.time(), 3), "wall_s": round(time.perf_counter() - wall, 3),
                    "cpu_s": round(own_after - own + started, 3), "child_cpu_s": round(started, 3)}
            with open(self.record, "a") as f:
                f.write(json.dumps(line) + "\n")

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item, call):
        outcome = yield
        report = outcome.get_result()
        if report.when in ("setup", "call") and report.passed and report.duration > self.limit:
            report.outcome = "failed"
            report.longrepr = (f"{item.nodeid}: its {report.when} took {report.duration:.1f} s, over the "
                               f"{self.limit:g} s limit for one test ({LIMIT_ENV}). The suite must run in "
                               "5 minutes on 2 cores: make it cheaper (in-process, a shared fixture, a smaller "
                               "model) or split it; `make test-durations` shows where the time goes.")


def install(config) -> None:
    """Register the plugin (called from conftest's pytest_configure). The record's prefix is taken
    out of the environment of every process that runs tests, so that a pytest those tests start (a
    broken copy's, tests/test_mutations.py) does not write into this run's record; the xdist
    controller keeps it for the workers it starts."""
    controller = bool(getattr(config.option, "numprocesses", None)) and not hasattr(config, "workerinput")
    target = os.environ.get(RECORD_ENV) if controller else os.environ.pop(RECORD_ENV, None)
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    config.pluginmanager.register(DurationPlugin(Path(f"{target}.{worker}") if target else None),
                                  "attnbench-durations")


# --- the report ------------------------------------------------------------------------------------
def read_lines(prefix: Path) -> list[dict]:
    rows = []
    for path in sorted(prefix.parent.glob(prefix.name + ".*")):
        rows += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return rows


def report(rows: list[dict], slowest: int = 15) -> str:
    per_file: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0, 0])
    for row in rows:
        entry = per_file[row["test"].split("::")[0]]
        entry[0] += row["cpu_s"]
        entry[1] += row.get("child_cpu_s", 0.0)  # records written before the column: none counted
        entry[2] += row["wall_s"]
        entry[3] += 1
    cpu, wall = sum(r["cpu_s"] for r in rows), sum(r["wall_s"] for r in rows)
    children = sum(r.get("child_cpu_s", 0.0) for r in rows)
    lines = [f"{len(rows)} tests: {cpu:.0f} s of CPU ({children:.0f} s of it in the processes they started),",
             f"{wall:.0f} s of test wall time (summed over workers)",
             "", f"{'CPU s':>7} {'in children':>11} {'wall s':>7} {'tests':>5}  file"]
    for name, (c, child, w, n) in sorted(per_file.items(), key=lambda kv: -kv[1][0]):
        lines.append(f"{c:7.1f} {child:11.1f} {w:7.1f} {n:5d}  {name.removeprefix('tests/')}")
    # a test's name is often longer than a table's column: each on a line of its own, whole
    lines += ["", f"the {slowest} slowest tests (wall; limit {limit_s():g} s each for setup and call):"]
    for row in sorted(rows, key=lambda r: -r["wall_s"])[:slowest]:
        file, _, test = row["test"].removeprefix("tests/").partition("::")
        lines += [f"{row['wall_s']:7.1f} s wall {row['cpu_s']:7.1f} s CPU "
                  f"({row.get('child_cpu_s', 0.0):.1f} in children)  {file}", f"    {test}"]
    return "\n".join(lines)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python tests/durations.py FILE  (the ATTNBENCH_TEST_DURATIONS prefix of a test run)")
    found = read_lines(Path(sys.argv[1]))
    if not found:
        sys.exit(f"no durations under {sys.argv[1]}.*: run the suite with {RECORD_ENV}={sys.argv[1]} first")
    print(report(found))
