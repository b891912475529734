"""Runs the guarding tests of several broken copies of the project (tests/test_mutations.py), each
in a process forked from one that has already imported the third-party libraries: torch (and the
torch._dynamo a torch optimiser imports), Hydra, pandas, scipy.stats and pytest are imported once for
every copy instead of once per copy (2-3 s of CPU each, 4-5 s where a guard trains).
Nothing of the project is imported before the fork, so each child imports its own copy's. As many
children run at once as the process has cores.

``python tests/mutants.py SPEC.json``: SPEC is a list of [name, copy folder, [guard test ids]]; prints
one JSON object, name -> {"exit": pytest's exit status, "where": the bench_cli the child ran,
"output": the end of what pytest printed}.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path


def run_guards(copy: Path, guards: list[str]) -> None:
    """In the forked child: the copy first on the path, its guards run by pytest; never returns."""
    out = os.open(copy / "pytest.out", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(out, 1)
    os.dup2(out, 2)
    os.chdir(copy)
    sys.path.insert(0, str(copy))
    os.environ["PYTHONPATH"] = str(copy)  # and in any process a guard starts
    import pytest

    import bench_cli

    (copy / "where.txt").write_text(bench_cli.__file__)
    code = pytest.main(["-x", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", *guards])
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(int(code))


def main(spec_path: str) -> None:
    spec = json.loads(Path(spec_path).read_text())
    import hydra  # noqa: F401 - imported once, before the forks (see the module's docstring)
    import numpy  # noqa: F401
    import omegaconf  # noqa: F401
    import pandas  # noqa: F401
    import pytest  # noqa: F401
    import scipy.stats  # noqa: F401 - the report's statistics (Welch's t)
    import torch  # noqa: F401
    import torch._dynamo  # noqa: F401 - what a torch optimiser's construction imports (1.8 s)

    # one child per core at a time: the copies are independent, each in its own folder
    at_once = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    running, statuses = {}, {}
    for name, copy, guards in spec:
        if len(running) >= at_once:
            pid, status = os.wait()
            statuses[running.pop(pid)] = status
        pid = os.fork()
        if pid == 0:
            try:
                run_guards(Path(copy), guards)
            finally:
                os._exit(70)  # an exception before pytest ran: never a pass
        running[pid] = name
    while running:
        pid, status = os.wait()
        statuses[running.pop(pid)] = status
    results = {}
    for name, copy, _ in spec:
        where = Path(copy) / "where.txt"
        results[name] = {"exit": os.waitstatus_to_exitcode(statuses[name]),
                         "where": where.read_text() if where.exists() else "",
                         "output": (Path(copy) / "pytest.out").read_text()[-3000:]}
    print(json.dumps(results))


if __name__ == "__main__":
    main(sys.argv[1])
