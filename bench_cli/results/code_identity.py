"""Which code made a record: a content hash of each module a run's result depends on by name.

The git commit (``git_commit``, ``git_dirty``) says which attnbench made a record; it says
nothing of a plugin, whose files live outside the repository (bench_cli/config/plugins.py). So
every record carries ``code_hashes``: {module: sha256 of its source, 16 hex digits} for

- every plugin module of the run's process (a package: all its ``.py`` files);
- the module that registered the run's attention (and the final layer's, when another), and the
  module of the task's class: the grain at which a result can honestly be tied to code without
  tracing every import (the layers, backbones and trainer they use are the git commit's).

Two readers act on it. A sweep takes a job whose record was made by a plugin that has changed
since as not done (:func:`changed_plugins`): lm-evaluation-harness versions its tasks for the
same reason, so old numbers are never reported as the new code's. A report refuses to put
records of one model made by different code into one mean (:func:`mixed_code`) unless asked.
Built-in modules are compared by the report only: a sweep keeps their records (their refactors
are checked number for number, docs/architecture.md), and ``git_commit`` already names them.
Records written before this column have no hashes: nothing is known, nothing is refused.
"""
from __future__ import annotations

import hashlib
import importlib.util
import json
import sys
from pathlib import Path

from bench_cli.core.errors import UserError
from bench_cli.core.registry import is_builtin

COLUMN = "code_hashes"  # the record column (bench_cli/results/schema.py declares it)


def is_plugin(module: str) -> bool:
    return not is_builtin(module)


def module_files(module: str) -> list[Path] | None:
    """The source files of ``module`` (a package: every ``.py`` below its folder, sorted); None
    when it cannot be found. An imported module is read where it was imported from."""
    loaded = sys.modules.get(module)
    origin = getattr(loaded, "__file__", None)
    if origin is None:
        try:
            spec = importlib.util.find_spec(module)
        except (ImportError, ValueError):
            return None
        origin = spec.origin if spec is not None and spec.has_location else None
    if origin is None or not Path(origin).is_file():
        return None
    path = Path(origin)
    if path.name == "__init__.py":
        return sorted(p for p in path.parent.rglob("*.py") if "__pycache__" not in p.parts)
    return [path]


def module_digest(module: str) -> str | None:
    """sha256 (16 hex digits) of ``module``'s source files, each with its path relative to the
    first (a file moved inside a package changes it); None when the module is not found."""
    files = module_files(module)
    if files is None:
        return None
    root = files[0].parent
    digest = hashlib.sha256()
    for path in files:
        digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def run_modules(cfg) -> list[str]:
    """The modules a run's result depends on by name: the plugins of the process, the modules
    that registered its attentions, its task's module (in that order, each once)."""
    from omegaconf import OmegaConf

    from bench_cli.config import plugins

    modules = [p.module for p in plugins.loaded()]
    for key in ("model.attention.name", "model.final_attention.name"):
        name = OmegaConf.select(cfg, key, default=None)
        owner = _attention_owner(str(name)) if name else None
        if owner:
            modules.append(owner)
    task = _task_module(str(OmegaConf.select(cfg, "task.name", default="") or ""))
    if task:
        modules.append(task)
    return list(dict.fromkeys(modules))


def _attention_owner(name: str) -> str | None:
    from attnbench.models.attention.registry import ATTENTIONS

    return ATTENTIONS.owner(name) if name in ATTENTIONS else None


def _task_module(name: str) -> str | None:
    import attnbench.tasks as tasks

    try:
        return tasks.task_class(name).__module__ if name else None
    except UserError:
        return None


# {module: (the module object, its digest)} of the modules this process has run: the source as first
# seen after import, so a plugin edited while a sweep runs is not credited with the old code's results.
# A module imported again is another object, hashed again; the object itself is kept and compared
# (an id() alone can be reused by the new module once the old one is freed: the old digest then).
_AS_RUN: dict[str, tuple[object, str | None]] = {}


def digest_as_run(module: str) -> str | None:
    """``module``'s digest the first time this process asked, while the same module object is loaded."""
    loaded = sys.modules.get(module)
    if loaded is None:
        return module_digest(module)
    seen = _AS_RUN.get(module)
    if seen is None or seen[0] is not loaded:
        seen = _AS_RUN[module] = (loaded, module_digest(module))
    return seen[1]


def columns(cfg) -> dict:
    """The record's ``code_hashes`` cell: {module: digest} of :func:`run_modules`."""
    hashes = {m: digest_as_run(m) for m in run_modules(cfg)}
    return {COLUMN: {m: h for m, h in hashes.items() if h is not None}}


def recorded(row: dict) -> dict[str, str]:
    """A record's {module: digest} (empty for a record written before the column, or unreadable)."""
    value = row.get(COLUMN)
    if isinstance(value, dict):
        return value
    try:
        parsed = json.loads(value) if value else {}
    except ValueError:
        return {}
    return parsed if isinstance(parsed, dict) else {}


def changed_plugins(row: dict) -> list[str]:
    """The plugin modules of a record whose source is no longer what made it ('mymod', or
    'mymod (not found)'); empty when the record is current or has no hashes."""
    changed = []
    for module, digest in recorded(row).items():
        if is_plugin(module):
            now = module_digest(module)
            if now != digest:
                changed.append(module if now is not None else f"{module} (not found)")
    return changed


def stale_jobs(rows: list[dict]) -> dict[str, str]:
    """job_key -> why its ok record no longer counts ('plugin changed since the record: mymod'),
    for the ``rows`` made by plugin code that has changed since."""
    out = {}
    for r in rows:
        if r.get("status") == "ok" and r.get("job_key") and (changed := changed_plugins(r)):
            out[r["job_key"]] = f"plugin changed since the record: {', '.join(changed)}"
    return out


def mixed_code(rows: list[dict]) -> str | None:
    """What differs between the code of ``rows`` (the records of one model that a report would
    average): 'mymod 1a2b... (seeds 0 1) vs 3c4d... (seed 2)' per module, or None when they agree
    (a record without a module's hash agrees with any)."""
    by_module: dict[str, dict[str, list[str]]] = {}
    for r in rows:
        for module, digest in recorded(r).items():
            by_module.setdefault(module, {}).setdefault(digest, []).append(str(r.get("seed", "?")))
    parts = []
    for module, digests in by_module.items():
        if len(digests) > 1:
            parts.append(f"{module} " + " vs ".join(
                f"{d[:8]} (seed{'s' if len(s) > 1 else ''} {' '.join(s)})" for d, s in digests.items()))
    return "; ".join(parts) or None


class MixedCodeError(UserError):
    """A report would average records of one model made by different code."""


def refuse_mixed(cells, allowed: bool) -> list[str]:
    """Refuse (MixedCodeError naming the first difference) to report a cell whose records were made
    by different code, unless ``allowed`` (``report --mixed-code``); then the differences are notes."""
    mixed = [(f"{c.dataset}/{c.rows[0].get('model') or c.model}", why) for c in cells if (why := mixed_code(c.rows))]
    if mixed and not allowed:
        cell, why = mixed[0]
        raise MixedCodeError(f"{cell}: records made by different code ({why}); rerun the "
                             f"old ones (attnbench sweep ... --force, or a sweep reruns a changed plugin's jobs "
                             f"itself) or pass --mixed-code to report them together")
    return [f"Made by different code, reported together (--mixed-code): {cell}: {why}." for cell, why in mixed]
