"""attnbench's one import namespace: models/, tasks/ and conf/ are imported only as attnbench.models,
attnbench.tasks and attnbench.conf, so a research project's own `models` or `tasks` package first on
sys.path changes nothing; plugins import the public API from `attnbench`; the old `models.*` path
still works, with a DeprecationWarning, where no other `models` exists."""
from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

from conftest import attnbench, python_path_with

ROOT = Path(__file__).resolve().parents[1]
BARE = ("models", "tasks", "conf")


def foreign_project(tmp_path: Path) -> Path:
    """A research project's folder: its own models/ and tasks/ packages, unrelated to attnbench."""
    for name in ("models", "tasks"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text(f'WHOSE = "the project\'s own {name}"\n')
    return tmp_path


def test_a_projects_own_models_and_tasks_first_on_the_path_change_nothing(tmp_path):
    project = foreign_project(tmp_path)
    env = {"PYTHONPATH": python_path_with(project), "COLUMNS": "80"}
    listing = attnbench("ls", "models", env=env, cwd=project, timeout=120)
    assert listing.returncode == 0 and "softmax" in listing.stdout, listing.stderr
    validated = attnbench("validate", "task=uea", "model=softmax", env=env, cwd=project, timeout=120)
    assert validated.returncode == 0, validated.stderr
    assert "Traceback" not in listing.stderr + validated.stderr


def test_the_old_plugin_path_works_with_a_warning_naming_the_new_one(tmp_path):
    code = ("import warnings; warnings.simplefilter('always')\n"
            "import attnbench.models.attention as new\n"
            "with warnings.catch_warnings(record=True) as said:\n"
            "    warnings.simplefilter('always')\n"
            "    from models.attention import register_attention, ProjectedAttention\n"
            "    import models.attention as old\n"
            "print(old is new, register_attention is new.register_attention)\n"
            "print([str(w.message) for w in said if w.category is DeprecationWarning])\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path,
                         check=True).stdout.splitlines()
    assert out[0] == "True True"  # the same module object: one registry, not a second copy
    assert "deprecated" in out[1] and "attnbench.models" in out[1]
    # a script in a checkout (the repository's root on sys.path) that imports the old name before
    # anything imported attnbench: the folder becomes the alias, still one registry. (Outside a
    # checkout, the old names exist only once attnbench is imported, as it is before any plugin.)
    before = ("from models.attention import register_attention\n"
              "import attnbench.models.attention as new, tasks, attnbench.tasks\n"
              "print(register_attention is new.register_attention, tasks is attnbench.tasks)")
    again = subprocess.run([sys.executable, "-W", "always::DeprecationWarning", "-c", before], capture_output=True,
                           text=True, cwd=ROOT, check=True)
    assert again.stdout.strip() == "True True" and "deprecated: import attnbench.models" in again.stderr


def test_a_projects_own_models_is_imported_as_its_own(tmp_path):
    project = foreign_project(tmp_path)
    code = "import attnbench.models.attention, models, tasks; print(models.WHOSE, '|', tasks.WHOSE)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=project, check=True,
                         env={**os.environ, "PYTHONPATH": python_path_with(project)}).stdout
    assert out.strip() == "the project's own models | the project's own tasks"


def test_the_public_api_imports_from_attnbench_and_import_attnbench_is_light():
    code = ("import sys, attnbench; light = not {'torch', 'hydra'} & set(sys.modules)\n"
            "from attnbench import register_attention, ProjectedAttention, Capabilities, register_task\n"
            "from attnbench.models.attention import ProjectedAttention as base\n"
            "print(light, ProjectedAttention is base)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "True True"


def test_attnbenchs_code_imports_models_tasks_and_conf_only_under_attnbench():
    """A bare `import models` in attnbench's own code would pick up a project's models/ instead."""
    bare = []
    for folder in ("bench_cli", "attnbench", "models", "tasks", "tests", "tools"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                         else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
                bare += [f"{path.relative_to(ROOT)}:{node.lineno} {name}" for name in names
                         if name.partition(".")[0] in BARE]
    assert not bare, f"import these as attnbench.models / attnbench.tasks / attnbench.conf: {bare}"
