"""A warning said once per process goes through one helper, bench_cli.core.errors.warn_once: a sweep's
jobs, or the readers of one records file (plan, resume, report), share one line instead of repeating
it, and no module keeps a set of its own."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

import source_trees

ROOT = Path(__file__).resolve().parents[1]


def test_a_warning_is_printed_once_per_process(monkeypatch, capsys):
    from bench_cli.core import errors

    monkeypatch.setattr(errors, "_WARNED", set())
    for _ in range(3):
        errors.warn_once("warning: one thing")
    errors.warn_once("warning: another")
    assert capsys.readouterr() == ("", "warning: one thing\nwarning: another\n")


def test_an_incomplete_records_row_is_said_once_for_every_reader(tmp_path, monkeypatch, capsys):
    from bench_cli.core import errors
    from bench_cli.results.csv_store import read_records

    monkeypatch.setattr(errors, "_WARNED", set())
    path = tmp_path / "runs.csv"
    path.write_text("run_id,model,seed\nr0,softmax,0\nr1,softmax\n")
    for _ in range(3):  # the sweep's plan, its resume and the report read the same file
        assert [r["seed"] for r in read_records(path)] == ["0", None]
    assert capsys.readouterr().err == (f"warning: {path} line 3: incomplete row (2 of 3 fields; a half-written "
                                       "line?): kept as it is, its missing fields read as blank\n")


@pytest.mark.xdist_group(source_trees.GROUP)  # the parsed trees shared (tests/source_trees.py)
def test_no_module_keeps_its_own_set_of_warnings_said():
    """A function named like ``*warn*once*`` or a module-level set named ``*WARNED*``/``*SAID*``
    anywhere but bench_cli/core/errors.py is a second warn-once."""
    twins = []
    for package in ("bench_cli", "attnbench", "tasks", "models"):
        for path in sorted((ROOT / package).rglob("*.py")):
            if path == ROOT / "bench_cli" / "core" / "errors.py":
                continue
            for node in ast.walk(source_trees.tree(path)):
                name = node.name if isinstance(node, ast.FunctionDef) else None
                if isinstance(node, (ast.Assign, ast.AnnAssign)):
                    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                    name = next((t.id for t in targets if isinstance(t, ast.Name)), None)
                    name = name if name and any(w in name.upper() for w in ("WARNED", "SAID")) else None
                elif name and not ("warn" in name.lower() and "once" in name.lower()):
                    name = None
                if name:
                    twins.append(f"{path.relative_to(ROOT)}:{name}")
    assert not twins, f"warn-once twins: {twins} (use bench_cli.core.errors.warn_once)"
