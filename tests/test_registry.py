"""The one Registry (bench_cli/core/registry.py): a taken name is refused naming both owners, an
unknown name is one line listing the valid ones, a "module:object" entry is imported only when it
is looked up; and attentions, tasks, fetchers and the CLI's verbs are each that class, with no
registry written by hand beside them."""
from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

import source_trees

from bench_cli.core.errors import EXIT_USAGE, UserError
from bench_cli.core.registry import NameTakenError, Registry

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("bench_cli", "attnbench", "tasks", "models")
# Functions named register* that fill another library's registry, not one of ours, with the reason.
OTHER_LIBRARIES = {"register_resolvers": "OmegaConf keeps the config resolvers (OmegaConf.register_new_resolver)"}


# --- the class --------------------------------------------------------------------------------------
def test_a_taken_name_is_refused_naming_both_owners():
    registry = Registry("widget")
    first = object()
    registry.register("w", first, owner="pkg.first")
    with pytest.raises(NameTakenError) as e:
        registry.register("w", object(), owner="plugin_two")
    assert str(e.value) == ("widget 'w' is already registered by pkg.first; plugin_two cannot register it again: "
                            "choose another name")
    assert isinstance(e.value, UserError) and e.value.exit_code == EXIT_USAGE  # one line, exit status 2
    registry.register("b", 1, owner="attnbench.models.x")
    with pytest.raises(NameTakenError, match=r"by attnbench\.models\.x \(built-in\); mine cannot"):
        registry.register("b", 2, owner="mine")
    with pytest.raises(NameTakenError):  # the same entry from another module is still another owner
        registry.register("w", first, owner="pkg.other")
    assert registry.register("w", first, owner="pkg.first") is first  # the same module again: a no-op
    assert registry.get("w") is first and registry.owner("w") == "pkg.first"


def test_an_unknown_name_is_one_line_listing_the_valid_ones():
    registry = Registry("widget")
    for name in ("beta", "alpha", "gamma"):
        registry.register(name, name.upper(), owner=__name__)
    with pytest.raises(UserError) as e:
        registry.get("alpah")
    assert str(e.value) == "unknown widget 'alpah' (did you mean 'alpha'?); valid: alpha, beta, gamma"
    assert e.value.exit_code == EXIT_USAGE
    with pytest.raises(UserError, match="^unknown widget 'zzz'; valid: alpha, beta, gamma$"):
        registry.check("zzz")
    assert registry.names() == ["alpha", "beta", "gamma"] and "beta" in registry and "zzz" not in registry


def test_a_lazy_entry_is_imported_when_it_is_first_looked_up(tmp_path, monkeypatch):
    (tmp_path / "lazy_probe_module.py").write_text("IMPORTS = [1]\nclass Thing:\n    class Inner:\n        pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    registry = Registry("thing")
    registry.register("thing", "lazy_probe_module:Thing", owner=__name__)
    registry.register("inner", "lazy_probe_module:Thing.Inner", owner=__name__)
    try:
        assert registry.names() == ["inner", "thing"] and "thing" in registry
        registry.check("thing")
        assert "lazy_probe_module" not in sys.modules  # listing and checking names import nothing
        thing = registry.get("thing")
        module = sys.modules["lazy_probe_module"]
        assert thing is module.Thing and registry.get("inner") is module.Thing.Inner
        assert registry.get("thing") is thing and module.IMPORTS == [1]
    finally:
        sys.modules.pop("lazy_probe_module", None)


def test_restoring_forgets_what_was_registered_inside():
    registry = Registry("widget")
    registry.register("kept", 1, owner=__name__)
    with registry.restoring():
        registry.register("passing", 2, owner=__name__)
        assert registry.names() == ["kept", "passing"]
    assert registry.names() == ["kept"]


# --- the four registries ---------------------------------------------------------------------------
def the_four() -> dict[str, Registry]:
    import attnbench.tasks as tasks
    from bench_cli.commands.cli import COMMANDS
    from bench_cli.core.fetch import FETCHERS
    from attnbench.models.attention import ATTENTIONS

    tasks.discover()
    return {"attention": ATTENTIONS, "task": tasks.TASKS, "dataset source": FETCHERS, "command": COMMANDS}


def test_attentions_tasks_fetchers_and_commands_are_each_the_registry():
    for kind, registry in the_four().items():
        assert type(registry) is Registry and registry.kind == kind
        assert len(registry.names()) > 5, kind


def duplicate_in(kind: str) -> None:
    """Register, from this module, a name a built-in holds, through the registry's public way in."""
    if kind == "attention":
        from attnbench.models.attention import ProjectedAttention, register_attention

        register_attention("softmax", paper="-", equation="-")(type("Dup", (ProjectedAttention,), {}))
    elif kind == "task":
        from bench_cli.core.task import Task
        from attnbench.tasks import register_task

        register_task(type("Dup", (Task,), {"name": "uea", "__module__": __name__}))
    elif kind == "dataset source":
        from bench_cli.core.fetch import Fetcher, register_fetcher

        register_fetcher(type("Dup", (Fetcher,), {"name": "uea", "__module__": __name__}))
    else:
        from bench_cli.commands.cli import COMMANDS

        COMMANDS.register("run", print, owner=__name__)


@pytest.mark.parametrize("kind", ["attention", "task", "dataset source", "command"])
def test_each_registry_refuses_a_taken_name_with_the_one_error(kind):
    registry = the_four()[kind]
    with registry.restoring():
        with pytest.raises(NameTakenError) as e:
            duplicate_in(kind)
    holder = {"attention": "attnbench.models.attention.softmax", "task": "attnbench.tasks.uea",
              "dataset source": "attnbench.tasks.uea",
              "command": "bench_cli.commands.cli"}[kind]
    assert f"is already registered by {holder} (built-in); {__name__} cannot register it again" in str(e.value)


@pytest.mark.parametrize("kind", ["attention", "task", "dataset source"])
def test_each_lookup_answers_an_unknown_name_with_the_valid_ones(kind):
    from attnbench.models.attention import attention_spec
    from attnbench.tasks import task_class
    from attnbench.tasks.fetch import fetcher

    lookup = {"attention": attention_spec, "task": task_class, "dataset source": fetcher}[kind]
    with pytest.raises(UserError) as e:
        lookup("no_such_name")
    message = str(e.value)
    assert message.startswith(f"unknown {kind} 'no_such_name'") and "\n" not in message
    assert message.endswith("valid: " + ", ".join(the_four()[kind].names()))


# --- no registry by hand ---------------------------------------------------------------------------
def module_trees():
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            yield path.relative_to(ROOT), source_trees.tree(path)


@pytest.mark.xdist_group(source_trees.GROUP)  # the parsed trees shared (tests/source_trees.py)
def test_every_registry_is_the_one_class():
    """The module-level ``Registry(...)`` instances are the four above; every module-level function
    named ``register*`` (the decorators plugins and families call) goes through a Registry's
    ``register``. A fifth registry written by hand (a dict filled by its own ``register_x``, with
    its own duplicate check) fails here."""
    instances, by_hand = [], []
    for path, tree in module_trees():
        for node in tree.body:
            value = node.value if isinstance(node, (ast.Assign, ast.AnnAssign)) else None
            if isinstance(value, ast.Call) and getattr(value.func, "id", None) == "Registry":
                target = node.targets[0] if isinstance(node, ast.Assign) else node.target
                instances.append(f"{path}:{target.id}")
            if isinstance(node, ast.FunctionDef) and node.name.startswith("register") \
                    and node.name not in OTHER_LIBRARIES:
                calls = [n for n in ast.walk(node) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)]
                if not any(c.func.attr == "register" for c in calls):
                    by_hand.append(f"{path}:{node.name}")
    assert sorted(instances) == ["bench_cli/commands/cli.py:COMMANDS", "bench_cli/core/fetch.py:FETCHERS",
                                 "models/attention/registry.py:ATTENTIONS", "tasks/__init__.py:TASKS"]
    assert not by_hand, f"register functions that keep their own registry: {by_hand} (use bench_cli.core.registry)"
    own_errors = [str(path) for path, _ in module_trees() if path != Path("bench_cli/core/registry.py")
                  and any(text in (ROOT / path).read_text() for text in ("registered twice", "already registered by"))]
    assert not own_errors, f"duplicate-name errors of their own: {own_errors} (NameTakenError is the one)"
