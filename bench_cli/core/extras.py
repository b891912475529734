"""Optional dependencies: a family's heavy packages are an extra of the attnbench package
(pyproject.toml), imported only when that family runs. When one is missing, the user reads one
line naming the extra to install, not an ImportError's traceback."""
from __future__ import annotations

import importlib

from bench_cli.core.errors import UserError


class MissingExtraError(UserError):
    """A package of an optional extra is not installed (one line, exit status 2)."""


def install_hint(extra: str) -> str:
    return f"pip install 'attnbench[{extra}]'"


def require(module: str, extra: str, why: str = ""):
    """``import module`` (dotted names too), or MissingExtraError naming ``extra``. ``why`` says
    what needs it ("task=d4rl"); the default names the extra. Only a missing module is turned into
    the one line: a module that is installed but fails on import (a broken build) raises as is."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        missing = e.name or module
        # The package asked for, or one it imports, is absent: both are fixed by the extra.
        raise MissingExtraError(f"{why or f'the {extra} extra'} needs {missing.split('.')[0]}, which is not "
                                f"installed: {install_hint(extra)}") from None
