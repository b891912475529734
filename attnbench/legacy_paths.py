"""The import paths of plugins written before attnbench had one namespace, kept working.

``from models.attention import register_attention`` (and any ``models.*`` or ``tasks.*``) gives
the very module objects of ``attnbench.models`` / ``attnbench.tasks``, with a DeprecationWarning
naming the new path, as long as the name is not a package of someone else's: when another
``models`` or ``tasks`` is importable from ``sys.path`` (a research project's own folder), this
finder steps aside and that one is imported, so it never breaks a project's code. Aliasing rather
than importing the folders a second time keeps one registry (two copies of
``attnbench.models.attention.registry`` would hold two sets of attentions).
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import warnings
from pathlib import Path

LEGACY = ("models", "tasks")
MESSAGE_START = r"'import (models|tasks)' is deprecated"


def _ours(top: str, namespace_path: list[str]) -> Path | None:
    """The folder attnbench.<top> is imported from (``namespace_path``: attnbench's __path__)."""
    return next(((Path(entry) / top).resolve() for entry in namespace_path
                 if (Path(entry) / top / "__init__.py").is_file()), None)


def _foreign(top: str, namespace_path: list[str]) -> bool:
    """Whether ``top`` is importable from sys.path as another project's package, not ours."""
    spec = importlib.machinery.PathFinder.find_spec(top)
    if spec is None or not spec.submodule_search_locations:
        return spec is not None  # a module of that name (models.py) is someone else's too
    ours = _ours(top, namespace_path)
    return all(Path(location).resolve() != ours for location in spec.submodule_search_locations)


class _AliasLoader(importlib.abc.Loader):
    """Hands out the module already imported under its attnbench name."""

    def __init__(self, target: str) -> None:
        self.target = target

    def create_module(self, spec):
        return importlib.import_module(self.target)

    def exec_module(self, module) -> None:
        pass  # already executed under its attnbench name


class LegacyPathFinder(importlib.abc.MetaPathFinder):
    def __init__(self, namespace_path: list[str]) -> None:
        self.namespace_path = namespace_path  # attnbench's __path__, the very list (read at each import)

    def find_spec(self, fullname: str, path=None, target=None):
        top = fullname.partition(".")[0]
        if top not in LEGACY or _foreign(top, self.namespace_path):
            return None
        new = f"attnbench.{fullname}"
        if importlib.util.find_spec(f"attnbench.{top}") is None:
            return None
        if "." not in fullname:
            warnings.warn(f"'import {fullname}' is deprecated: import {new} (or `from attnbench import ...`)",
                          DeprecationWarning, stacklevel=2)
        loader = _AliasLoader(new)
        module = importlib.import_module(new)
        return importlib.util.spec_from_loader(fullname, loader, is_package=hasattr(module, "__path__"))


def adopt(old_name: str) -> None:
    """Called by models/__init__.py or tasks/__init__.py imported under its old top-level name
    before attnbench was (a checkout on sys.path, nothing having installed the finder yet): the old
    name becomes the alias of attnbench.<name>, so that there is still one copy of each module."""
    new = f"attnbench.{old_name}"
    warnings.warn(f"'import {old_name}' is deprecated: import {new} (or `from attnbench import ...`)",
                  DeprecationWarning, stacklevel=3)
    sys.modules[old_name] = importlib.import_module(new)


def install(namespace_path: list[str]) -> None:
    """Put the finder first (once per process), so that it answers before the path finder would
    import our own folders a second time under their old names."""
    if not any(isinstance(finder, LegacyPathFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, LegacyPathFinder(namespace_path))
        # shown (once) where Python's defaults would hide a DeprecationWarning raised in a library
        warnings.filterwarnings("default", message=MESSAGE_START, category=DeprecationWarning)
