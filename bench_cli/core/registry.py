"""Names mapped to what they stand for: the one registry behind attentions (models/attention),
task families (tasks/), dataset fetchers (bench_cli/core/fetch.py) and the CLI's verbs
(bench_cli/commands/cli.py).

Every name has an owner, the module that registered it: a second module registering a name that
is taken is refused with one line naming both (a plugin must not silently replace a built-in or
another plugin). An unknown name is one line listing the valid ones. An entry may be given as a
``"module:object"`` string, imported the first time the name is looked up, so that listing the
names (`attnbench --help`, `ls`) imports nothing heavy.
"""
from __future__ import annotations

import importlib
from contextlib import contextmanager
from typing import Generic, TypeVar
from collections.abc import Iterator

from bench_cli.core.errors import UserError, unknown_choice

Entry = TypeVar("Entry")

# attnbench's own packages (the CLI, and attnbench.models / attnbench.tasks): a name one of them
# registered is a built-in (plugins live elsewhere).
BUILTIN_PACKAGES = ("bench_cli", "attnbench")


def is_builtin(module: str) -> bool:
    """Whether ``module`` is attnbench's own (bench_cli.*, attnbench.models.*, attnbench.tasks.*), not a plugin's.
    Here, in the core, so that `attnbench ls` can ask without importing torch."""
    return module.split(".")[0] in BUILTIN_PACKAGES


class NameTakenError(UserError):
    """A second module registers a name another has: refused, naming both."""

    def __init__(self, kind: str, name: str, owner: str, newcomer: str):
        super().__init__(f"{kind} '{name}' is already registered by {owner}"
                         f"{' (built-in)' if is_builtin(owner) else ''}; {newcomer} cannot register it again: "
                         f"choose another name")
        self.kind, self.name, self.owner, self.newcomer = kind, name, owner, newcomer


class _Registration:
    """One name's entry (or its ``"module:object"`` reference until it is looked up) and owner."""

    __slots__ = ("entry", "owner")

    def __init__(self, entry: object, owner: str):
        self.entry, self.owner = entry, owner


def _resolve(reference: str) -> object:
    """The object a ``"module:object"`` reference names (``object`` may be dotted: ``Class.attr``)."""
    module, _, path = reference.partition(":")
    found = importlib.import_module(module)
    for part in path.split("."):
        found = getattr(found, part)
    return found


class Registry(Generic[Entry]):
    """Names of one ``kind`` ("attention", "task", ...) -> entries, each with the module that owns it."""

    def __init__(self, kind: str):
        self.kind = kind
        self._names: dict[str, _Registration] = {}

    def register(self, name: str, entry: Entry | str, *, owner: str) -> Entry | str:
        """Register ``entry`` (an object, or a ``"module:object"`` string imported on first use)
        under ``name`` for the module ``owner``; returns ``entry``. The same entry registered again
        by the same owner is a no-op (a module imported twice); anything else under a taken name
        raises :class:`NameTakenError`."""
        taken = self._names.get(name)
        if taken is not None:
            if taken.owner == owner and taken.entry is entry:
                return entry
            raise NameTakenError(self.kind, name, taken.owner, owner)
        self._names[name] = _Registration(entry, owner)
        return entry

    def check(self, name: str) -> None:
        """Raise the one-line unknown-name error (a UserError listing the valid names) unless
        ``name`` is registered; imports nothing."""
        if name not in self._names:
            raise unknown_choice(self.kind, name, self.names())

    def get(self, name: str) -> Entry:
        """The entry registered as ``name`` (a ``"module:object"`` entry is imported now, once)."""
        self.check(name)
        registration = self._names[name]
        if isinstance(registration.entry, str):
            registration.entry = _resolve(registration.entry)
        return registration.entry

    def owner(self, name: str) -> str:
        """The module that registered ``name``."""
        self.check(name)
        return self._names[name].owner

    def names(self) -> list[str]:
        """Every registered name, sorted; imports nothing."""
        return sorted(self._names)

    def __contains__(self, name: object) -> bool:
        return name in self._names

    def forget(self, name: str) -> None:
        """Drop ``name`` if registered: its module is to be imported again, as by a new process
        (a plugin edited between two in-process commands; the tests of code identity)."""
        self._names.pop(name, None)

    @contextmanager
    def restoring(self) -> Iterator[Registry[Entry]]:
        """Names registered inside the block are forgotten when it ends (tests, and in-process
        trials of plugins, register without leaking into what runs after them)."""
        saved = dict(self._names)
        try:
            yield self
        finally:
            self._names.clear()
            self._names.update(saved)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}: {len(self._names)} names)"
