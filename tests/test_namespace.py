"""attnbench's one import namespace: models/, tasks/ and conf/ are imported only as attnbench.models,
attnbench.tasks and attnbench.conf, so a research project's own `models` or `tasks` package first on
sys.path changes nothing; plugins import the public API from `attnbench`; the old `models.*` path
still works, with a DeprecationWarning, where no other `models` exists."""
from __future__ import annotations

import ast
import importlib
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

import source_trees
from conftest import commands_in_one_process, python_path_with

ROOT = Path(__file__).resolve().parents[1]
BARE = ("models", "tasks", "conf")


def foreign_project(tmp_path: Path) -> Path:
    """A research project's folder: its own models/ and tasks/ packages, unrelated to attnbench."""
    for name in ("models", "tasks"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text(f'WHOSE = "the project\'s own {name}"\n')
    return tmp_path


def test_a_projects_own_models_and_tasks_first_on_the_path_change_nothing(tmp_path):
    """In one fresh interpreter (each costs 3 s of imports), with a research project's own models/
    and tasks/ first on the path: `import attnbench` imports neither torch nor Hydra, the public API
    is attnbench's, the project's `models` and `tasks` are its own; then `attnbench ls models` and
    `validate` work as without them."""
    project = foreign_project(tmp_path)
    env = {"PYTHONPATH": python_path_with(project), "COLUMNS": "80"}
    prelude = ("import sys, attnbench; light = not {'torch', 'hydra'} & set(sys.modules)\n"
               "from attnbench import register_attention, ProjectedAttention, Capabilities, register_task\n"
               "from attnbench.models.attention import ProjectedAttention as base\n"
               "import models, tasks\n"
               "print(light, ProjectedAttention is base, models.WHOSE, '|', tasks.WHOSE)\n")
    listing, validated = commands_in_one_process([["ls", "models"], ["validate", "task=uea", "model=softmax"]],
                                                 prelude=prelude, env=env, cwd=project)
    api, _, listed = listing[1].partition("\n")
    assert api == "True True the project's own models | the project's own tasks"
    assert listing[0] == 0 and "softmax" in listed, listing[2]
    assert validated[0] == 0, validated[2]
    assert "Traceback" not in listing[2] + validated[2]


def test_the_old_plugin_path_works_with_a_warning_naming_the_new_one(monkeypatch):
    """In this process, where attnbench is imported: the old names are its finder's aliases."""
    import attnbench.models.attention as new

    for name in [m for m in sys.modules if m.partition(".")[0] == "models"]:  # as before any old import
        monkeypatch.delitem(sys.modules, name)
    try:
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            old = importlib.import_module("models.attention")  # a literal import would be a bare one
    finally:
        for name in [m for m in sys.modules if m.partition(".")[0] == "models"]:
            del sys.modules[name]
    assert old is new and old.register_attention is new.register_attention  # one registry, not a second copy
    deprecations = [str(w.message) for w in said if w.category is DeprecationWarning]
    assert any("deprecated" in message and "attnbench.models" in message for message in deprecations), deprecations
    # a script in a checkout (the repository's root on sys.path) that imports the old name before
    # anything imported attnbench: the folder becomes the alias, still one registry. (Outside a
    # checkout, the old names exist only once attnbench is imported, as it is before any plugin.)
    before = ("from models.attention import register_attention\n"
              "import attnbench.models.attention as new, tasks, attnbench.tasks\n"
              "print(register_attention is new.register_attention, tasks is attnbench.tasks)")
    again = subprocess.run([sys.executable, "-W", "always::DeprecationWarning", "-c", before], capture_output=True,
                           text=True, cwd=ROOT, check=True)
    assert again.stdout.strip() == "True True" and "deprecated: import attnbench.models" in again.stderr


@pytest.mark.xdist_group(source_trees.GROUP)  # the parsed trees shared (tests/source_trees.py)
def test_attnbenchs_code_imports_models_tasks_and_conf_only_under_attnbench():
    """A bare `import models` in attnbench's own code would pick up a project's models/ instead."""
    bare = []
    for folder in ("bench_cli", "attnbench", "models", "tasks", "tests", "tools"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            for node in ast.walk(source_trees.tree(path)):
                names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                         else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
                bare += [f"{path.relative_to(ROOT)}:{node.lineno} {name}" for name in names
                         if name.partition(".")[0] in BARE]
    assert not bare, f"import these as attnbench.models / attnbench.tasks / attnbench.conf: {bare}"
