"""The package's shape, kept (DESIGN.md and docs/architecture.md: layers a reader can follow): the import
graph of bench_cli, tasks and models, read with ``ast`` (imports inside functions included), has no cycle
between files, and imports point only down the layers: commands -> engine -> results -> config -> core,
with tasks/ and models/ on core alone (models nothing of tasks). No function is over 80 lines. Hydra's and
OmegaConf's private API is used only by the two fence modules (PRIVATE_API_FENCE), which list what they
use. Reading the source imports nothing (but the last test, which imports Hydra and OmegaConf to find the
symbols the fence lists), so this runs in a fraction of a second."""
from __future__ import annotations

import ast
import functools
import importlib
import importlib.util
import itertools
import re
from pathlib import Path

import pytest

import source_trees

# The tests that parse the project's code share the parsed trees in one xdist worker (tests/source_trees.py).
pytestmark = pytest.mark.xdist_group(source_trees.GROUP)

ROOT = Path(__file__).resolve().parents[1]
# folder -> the dotted name its modules are imported under: models/ and tasks/ only inside the
# attnbench namespace (attnbench/__init__.py), so an import of the bare names is no edge at all
PACKAGES = {"bench_cli": "bench_cli", "attnbench": "attnbench", "tasks": "attnbench.tasks",
            "models": "attnbench.models"}
MAX_FUNCTION_LINES = 80
# Functions allowed over MAX_FUNCTION_LINES, each with its reason. None today.
LONG_FUNCTIONS: dict[str, str] = {}

# Top to bottom: a module may import its own layer and the layers below it, never one above.
# The engine writes its record through results; results never run anything.
LAYERS = ("bench_cli.commands", "bench_cli.engine", "bench_cli.results", "bench_cli.config", "bench_cli.core")
# Old documented paths kept as one-line re-exports (pyproject's console script, `python -m
# bench_cli.cli` under torchrun, `python -m bench_cli.profile.overhead`): above every layer.
ENTRY_SHIMS = ("bench_cli.cli", "bench_cli.profile", "bench_cli.profile.overhead")
# The only modules that may import hydra._internal (or any private module of Hydra, OmegaConf and
# Hydra's plugins), read or call a private name of theirs, or replace an attribute of theirs: a
# Hydra release then breaks attnbench in these two files, which say what they rely on.
PRIVATE_API_FENCE = ("bench_cli.config.hydra_private", "bench_cli.config.omegaconf_private")
PRIVATE_API_OWNERS = ("hydra", "omegaconf", "hydra_plugins")


def module_files() -> dict[str, Path]:
    """Dotted module name -> its file, for every module of the three packages."""
    out = {}
    for folder, dotted in PACKAGES.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = [dotted, *path.relative_to(ROOT / folder).with_suffix("").parts]
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def imported(name: str, path: Path, known: set[str]) -> set[str]:
    """The modules of ``known`` that ``name`` imports anywhere in its file (lazy imports too);
    ``from pkg import sub`` counts as importing the submodule."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    out = set()
    for node in ast.walk(source_trees.tree(path)):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[:len(package) - node.level + 1] + ([node.module] if node.module else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        else:
            continue
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                out.add(target)
    return out


def import_graph() -> dict[str, set[str]]:
    files = module_files()
    return {name: imported(name, path, set(files)) for name, path in files.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index, low, stack, on_stack, found, counter = {}, {}, [], set(), [], itertools.count()
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.get(root, ()))))]
        index[root] = low[root] = next(counter)
        stack.append(root), on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = next(counter)
                    stack.append(child), on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def _within(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def layer_of(name: str) -> int | None:
    """The module's place in LAYERS (0: the top); None outside bench_cli's layers."""
    return next((i for i, layer in enumerate(LAYERS) if _within(name, layer)), None)


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """Every import against the layer rule, as 'importer -> imported'."""
    bad = []
    for name, targets in graph.items():
        for target in sorted(targets):
            if _within(name, "attnbench.tasks") or _within(name, "attnbench.models"):
                allowed = not _within(target, "bench_cli") or _within(target, "bench_cli.core")
                allowed = allowed and not (_within(name, "attnbench.models") and _within(target, "attnbench.tasks"))
            elif _within(name, "bench_cli.core"):
                allowed = _within(target, "bench_cli.core")
            elif name in ENTRY_SHIMS or name == "bench_cli" or target == "bench_cli":
                allowed = True  # bench_cli/__init__.py holds only the version and imports nothing
            elif _within(name, "bench_cli"):
                mine, theirs = layer_of(name), layer_of(target)
                allowed = (mine is not None and (theirs is None and not _within(target, "bench_cli")
                                                 or theirs is not None and theirs >= mine))
            else:
                allowed = True
            if not allowed:
                bad.append(f"{name} -> {target}")
    return bad


def functions_over(limit: int, source: str) -> dict[str, int]:
    """function name -> lines (decorators included), for the functions and methods of ``source``
    longer than ``limit`` lines."""
    out = {}
    for node in ast.walk(source_trees.parsed(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            lines = node.end_lineno - min([node.lineno] + [d.lineno for d in node.decorator_list]) + 1
            if lines > limit:
                out[node.name] = lines
    return out


def long_functions() -> dict[str, int]:
    """'module:function' -> lines, for the functions over MAX_FUNCTION_LINES in the three packages."""
    return {f"{name}:{function}": lines for name, path in module_files().items()
            for function, lines in functions_over(MAX_FUNCTION_LINES, path.read_text()).items()}


@functools.cache
def project_graph() -> dict[str, set[str]]:
    """The project's import graph, parsed once per test process, by the first test that reads it
    (at import it was 0.7 s of every test worker's collection)."""
    return import_graph()


def test_the_graph_sees_module_level_and_lazy_imports():
    # runner imports the trainer at module level, the zoo's report builds tasks inside a function
    assert "bench_cli.engine.trainer" in project_graph()["bench_cli.engine.runner"]
    assert "bench_cli.config.taskfit" in project_graph()["bench_cli.results.report.zoo"]
    assert len([m for m in project_graph() if _within(m, "bench_cli")]) > 50 and "attnbench.tasks.lra.tasks" in project_graph()


def test_no_cycle_between_files():
    assert cycles(project_graph()) == []


def test_every_bench_cli_module_sits_in_one_layer():
    loose = [m for m in project_graph() if _within(m, "bench_cli") and layer_of(m) is None
             and m not in ENTRY_SHIMS and m != "bench_cli"]
    assert loose == []


def test_imports_point_only_down_the_layers():
    assert upward_imports(project_graph()) == []
    assert project_graph()["bench_cli"] == set()


def test_no_function_over_80_lines_but_the_listed_ones():
    assert long_functions().keys() <= LONG_FUNCTIONS.keys()


def test_the_length_check_finds_a_planted_long_function():
    body = "\n".join(f"    x{i} = {i}" for i in range(80))
    source = f"def short():\n    pass\n\n\n@staticmethod\ndef planted():\n{body}\n"
    assert functions_over(MAX_FUNCTION_LINES, source) == {"planted": 82}


@pytest.mark.parametrize("graph, finds", [
    ({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}, [["a", "b", "c"]]),
    ({"a": {"b"}, "b": {"c"}, "c": set()}, []),
])
def test_the_cycle_check_finds_a_planted_cycle(graph, finds):
    assert cycles(graph) == finds


@pytest.mark.parametrize("importer, target", [
    ("bench_cli.engine.runner", "bench_cli.commands.sweep"),      # engine up to a command
    ("bench_cli.results.schema", "bench_cli.engine.measure"),     # results up to the engine
    ("bench_cli.core.errors", "bench_cli.config.compose"),        # core out of core
    ("attnbench.tasks.lra.tasks", "bench_cli.engine.trainer"),    # a task past core
    ("attnbench.models.lra", "attnbench.tasks.lra.tasks"),        # a model into tasks
    ("bench_cli.flat_module", "bench_cli.core.errors"),           # a module in no layer
])
def test_the_layer_check_refuses_a_planted_upward_import(importer, target):
    assert upward_imports({importer: {target}}) == [f"{importer} -> {target}"]


def test_the_layer_check_lets_downward_imports_pass():
    assert upward_imports({"bench_cli.commands.cli": {"bench_cli.engine.runner", "attnbench.tasks"},
                           "bench_cli.engine.runner": {"bench_cli.results.run_folder", "attnbench.models"},
                           "attnbench.tasks.lra.tasks": {"bench_cli.core.task"}}) == []


# --- the fence around Hydra's and OmegaConf's private API --------------------------------------
def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _owned(module: str) -> bool:
    return module.split(".")[0] in PRIVATE_API_OWNERS


@functools.cache
def library_private_names() -> frozenset[str]:
    """Every private name (one leading underscore) the installed Hydra, OmegaConf and Hydra plugins
    define: their functions and methods, the attributes they set, their class fields. Read from
    their source, nothing imported."""
    names = set()
    for owner in PRIVATE_API_OWNERS:
        spec = importlib.util.find_spec(owner)
        for folder in (spec.submodule_search_locations or []) if spec else []:
            for path in Path(folder).rglob("*.py"):
                for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
                    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                        names.add(node.name)
                    elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                        names.add(node.attr)
                    elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                        names.add(node.target.id)
    return frozenset(n for n in names if _private(n))


def private_api_uses(source: str, private_names=None) -> list[tuple[int, str]]:
    """(line, what) for each use of Hydra's or OmegaConf's private API in ``source``: an import of
    a private module or name of theirs (``hydra._internal...``, ``omegaconf._utils``), a private
    attribute of theirs read or called on anything but ``self``/``cls`` (``node._get_node``), and an
    attribute set on a module or class imported from them (``base.parse = ...``, ``setattr(...)``).
    ``what`` is the module, the attribute, or ``name.attribute`` set."""
    private_names = library_private_names() if private_names is None else private_names
    tree = source_trees.parsed(source)
    theirs = set()  # local names bound to their modules and classes
    uses = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if _owned(alias.name):
                    theirs.add((alias.asname or alias.name).split(".")[0])
                    if any(_private(part) for part in alias.name.split(".")):
                        uses.append((node.lineno, alias.name))
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level and _owned(node.module):
            theirs.update(alias.asname or alias.name for alias in node.names)
            if any(_private(part) for part in node.module.split(".")):
                uses.append((node.lineno, node.module))
            uses += [(node.lineno, f"{node.module}.{a.name}") for a in node.names if _private(a.name)]
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in private_names and not (
                isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
            uses.append((node.lineno, node.attr))
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, (ast.Store, ast.Del)) \
                and isinstance(node.value, ast.Name) and node.value.id in theirs:
            uses.append((node.lineno, f"{node.value.id}.{node.attr}"))
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("setattr", "delattr")
                and node.args and isinstance(node.args[0], ast.Name) and node.args[0].id in theirs):
            uses.append((node.lineno, f"{node.args[0].id}.{ast.unparse(node.args[1]) if len(node.args) > 1 else ''}"))
    return sorted(set(uses))


def private_api_users() -> dict[str, list[tuple[int, str]]]:
    return {name: uses for name, path in module_files().items()
            if (uses := private_api_uses(path.read_text(encoding="utf-8")))}


def test_only_the_fence_modules_use_hydras_and_omegaconfs_private_api():
    users = private_api_users()
    outside = {name: uses for name, uses in users.items() if name not in PRIVATE_API_FENCE}
    assert outside == {}, ("Hydra's or OmegaConf's private API outside bench_cli/config/hydra_private.py and "
                           "omegaconf_private.py: move the call there, behind a function with a public name, "
                           "and list the symbol in that module's docstring")
    assert set(users) == set(PRIVATE_API_FENCE)  # the fence is where this test says


def test_each_fence_module_lists_every_private_symbol_it_uses_and_the_versions():
    for name in PRIVATE_API_FENCE:
        source = module_files()[name].read_text(encoding="utf-8")
        docstring = ast.get_docstring(source_trees.parsed(source))
        unlisted = sorted({what for _, what in private_api_uses(source) if what.rpartition(".")[2] not in docstring
                           and what not in docstring})
        assert unlisted == [], f"{name} uses {unlisted} without naming them in its docstring"
        assert re.search(r"Checked against (hydra-core|omegaconf) \d+\.\d+\.\d+", docstring), name


PLANTED_PRIVATE_USES = {
    "from hydra._internal.utils import get_args_parser": "hydra._internal.utils",
    "import hydra._internal.hydra": "hydra._internal.hydra",
    "from omegaconf._utils import get_omega_conf_dumper": "omegaconf._utils",
    "from hydra_plugins.hydra_optuna_sweeper._impl import create": "hydra_plugins.hydra_optuna_sweeper._impl",
    "from omegaconf import _utils": "omegaconf._utils",
    "child = cfg._get_node('a')": "_get_node",
    "loader._parse_overrides_and_create_caching_repo(None, [])": "_parse_overrides_and_create_caching_repo",
    "from omegaconf import base\nbase.parse = cached": "base.parse",
    "from hydra.core.utils import JobReturn\nsetattr(JobReturn, 'return_value', None)": "JobReturn.'return_value'",
}


@pytest.mark.parametrize("source, found", PLANTED_PRIVATE_USES.items())
def test_the_fence_check_finds_a_planted_private_use(source, found):
    assert found in [what for _, what in private_api_uses(source)]


def test_the_fence_check_lets_public_api_and_own_privates_pass():
    source = ("from hydra import compose\nfrom hydra.core.global_hydra import GlobalHydra\n"
              "from omegaconf import OmegaConf, open_dict\nGlobalHydra.instance().clear()\n"
              "value = OmegaConf.select(cfg, 'a')\ncfg.hydra.mode = 1\nself._get_node = None\n"
              "from bench_cli.config import checks\nchecks._group_defaults.cache_clear()\n")
    assert private_api_uses(source) == []


def test_the_symbols_the_fence_lists_exist_in_the_installed_hydra_and_omegaconf():
    """Each ``module.Object.attribute`` the fence modules' docstrings name is found (this imports
    Hydra and OmegaConf; a Hydra plugin's is read from its source, when the plugin is installed):
    a release that drops one fails here, by name."""
    from omegaconf import OmegaConf

    missing, absent = [], object()
    for name in PRIVATE_API_FENCE:
        docstring = ast.get_docstring(source_trees.tree(module_files()[name]))
        for symbol in re.findall(r"``((?:hydra|omegaconf|hydra_plugins)(?:\.\w+)+)``", docstring):
            module, _, leaf = symbol.rpartition(".")
            if symbol.startswith("hydra_plugins."):  # an optional extra: importing it imports optuna
                try:
                    spec = importlib.util.find_spec(module)
                except ImportError:
                    spec = None
                if spec is not None and f"def {leaf}(" not in Path(spec.origin).read_text(encoding="utf-8"):
                    missing.append(symbol)
                continue
            parts, found, i = symbol.split("."), None, len(symbol.split("."))
            while found is None:  # the longest importable prefix is the module
                try:
                    found = importlib.import_module(".".join(parts[:i]))
                except ImportError:
                    i -= 1
            for part in parts[i:]:  # a node's instance attribute (_metadata) is looked up on a node
                found = getattr(found, part, getattr(OmegaConf.create({"k": 1}), part, absent))
                if found is absent:
                    missing.append(symbol)
                    break
    assert missing == []


MAX_MODULE_LINES = 600  # one concern a module: past this, a module is doing several things


def test_no_module_of_bench_cli_is_over_600_lines():
    long = {str(path.relative_to(ROOT)): n for path in sorted((ROOT / "bench_cli").rglob("*.py"))
            if (n := len(path.read_text().splitlines())) > MAX_MODULE_LINES}
    assert not long, f"over {MAX_MODULE_LINES} lines (split by concern): {long}"
