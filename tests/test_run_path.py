"""The run path is one straight line, so a reader follows a run top to bottom (DESIGN.md "One run, as a straight line"):
``runner.run_experiment`` reads top to bottom in at most 40 lines, its stages in order, each
entered once; the trainer holds the loop, not the environment. Read from the source with ``ast``
(imports nothing). That the numbers stay the same is tests/family_records.py's comparison."""
from __future__ import annotations

import ast
from pathlib import Path

ENGINE = Path(__file__).resolve().parents[1] / "bench_cli" / "engine"
# The stages of one run, in order: environment -> run folder -> task -> model -> fit -> measure -> record.
STAGES = ("prepare_environment", "start_run", "set_up_task", "build_model", "Trainer", "fit", "measure_run",
          "finish")


def functions(path: Path) -> dict[str, ast.FunctionDef]:
    return {n.name: n for n in ast.parse(path.read_text()).body if isinstance(n, ast.FunctionDef)}


def called(function: ast.FunctionDef) -> list[str]:
    """The names called in ``function``, in the order of the source (``a.b()`` is ``b``)."""
    calls = [n for n in ast.walk(function) if isinstance(n, ast.Call)]
    calls.sort(key=lambda n: (n.lineno, n.col_offset))
    return [c.func.attr if isinstance(c.func, ast.Attribute) else getattr(c.func, "id", "") for c in calls]


def test_run_experiment_is_one_function_of_at_most_40_lines_with_its_stages_in_order_each_once():
    run = functions(ENGINE / "runner.py")["run_experiment"]
    first = run.body[1] if isinstance(run.body[0], ast.Expr) else run.body[0]  # after the docstring
    assert run.end_lineno - first.lineno + 1 <= 40
    names = called(run)
    assert [n for n in names if n in STAGES] == list(STAGES)


def test_the_trainer_holds_no_environment_helpers():
    """Device choice, seeding and precision are the environment's (engine/env.py), not the loop's."""
    helpers = {"select_device", "seed_everything", "seed_worker", "autocast", "deterministic_algorithms"}
    assert not helpers & set(functions(ENGINE / "trainer.py"))
    assert helpers <= set(functions(ENGINE / "env.py"))
