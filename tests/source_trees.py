"""Python source parsed once per test process: the tests that read the project's code (its layers,
its import namespace, its registries, its warnings) walk the same trees, each parse of the whole
project costing about a second. A tree is shared by every caller: read it, never change it.
Those tests are one xdist group ("source_trees"), so that one worker parses."""
from __future__ import annotations

import ast
import functools
from pathlib import Path

GROUP = "source_trees"  # the xdist_group of the tests that read the trees


@functools.cache
def parsed(source: str) -> ast.Module:
    """``source`` parsed: the one tree of that text in this process."""
    return ast.parse(source)


def tree(path: Path) -> ast.Module:
    """The file at ``path`` parsed (its text read anew, so an edited file is parsed anew)."""
    return parsed(Path(path).read_text(encoding="utf-8"))
