"""Dataset fetchers: what `attnbench data NAME [DATASET] [--option...]` runs, and the one place
that answers whether a dataset is present.

A fetcher puts datasets under the data root (copies a packaged copy, downloads and verifies an
archive, or runs a generator) and says whether they are there: ``status`` (cheap, for
`attnbench ls datasets`) and ``require`` (the check `validate`, `run` and a task's ``setup`` go
through: one line saying where the files go and how to fetch them). It is separate from the tasks
that read the data: one fetcher may serve several tasks (the LRA release holds ListOps, Retrieval
and Pathfinder) and a task never exists only to be fetched. A task names its fetcher and asks it;
a fetcher never asks a task. Fetchers register themselves with :func:`register_fetcher` in
``FETCHERS`` (the project's one ``Registry``, bench_cli/core/registry.py); their modules are
imported with the task families (``tasks.discover``).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar
from collections.abc import Iterable

from bench_cli.core.errors import DataNotFoundError, UserError
from bench_cli.core.registry import Registry

STATUSES = ("local", "package", "missing")


class Fetcher:
    """One source of datasets. Subclasses set ``name`` and ``options`` and implement the methods."""

    name: ClassVar[str]
    summary: ClassVar[str] = ""
    # Options `attnbench data NAME --opt[=value]` accepts: name -> what it does. Flags without a
    # value arrive as True, others as strings.
    options: ClassVar[dict[str, str]] = {}

    def datasets(self, data_root: Path) -> list[str]:
        raise NotImplementedError

    def status(self, dataset: str, data_root: Path) -> str:
        """'local' (under the data root), 'package' (shipped in an installed package), 'missing', or
        'damaged' (there, but a file that says what it holds cannot be read: fetch it again)."""
        raise NotImplementedError

    def location(self, dataset: str, data_root: Path) -> str:
        """Where ``dataset`` is read from, or would be read from once its files are there: what
        `attnbench ls datasets` shows, so that on a node without internet the files can be put
        there by hand. A path, under the data root unless the dataset is read from elsewhere (an
        installed package's copy, the HF cache); a folder ends in '/', files are a pattern
        ('basic_{train,val,test}.tsv'). '' when the fetcher does not say."""
        return ""

    def missing_message(self, dataset: str, data_root: Path, **options) -> str:
        """One line: which files are missing, where they go, and the command that fetches them."""
        return f"{self.name} dataset {dataset} not found under {data_root}: run `attnbench data {self.name} {dataset}`"

    def require(self, dataset: str, data_root: Path, *, cached: Iterable[Path] = (), **options) -> Any:
        """Raise DataNotFoundError (``missing_message``) unless ``dataset`` can be read; reads no
        data. A file in ``cached`` (a task's preprocessed copy) makes the source unnecessary.
        ``options`` are what the reader's choice of files depends on (e.g. Pathfinder's
        difficulty). Returns what the task reads from when the check found it (a folder, a loaded
        HF dataset), else None."""
        if any(Path(p).is_file() for p in cached):
            return None
        if self.status(dataset, data_root) == "missing":
            raise DataNotFoundError(self.missing_message(dataset, data_root, **options))
        return None

    def fetch(self, dataset: str, data_root: Path, force: bool = False, **options) -> Path:
        """Put ``dataset`` under the data root; return its folder."""
        raise NotImplementedError

    def default_dataset(self, data_root: Path, **options) -> str | None:
        """The dataset meant when `attnbench data NAME` names none (the only one, if one)."""
        names = self.datasets(data_root)
        return names[0] if len(names) == 1 else None

    def options_from_config(self, task_cfg, options: dict) -> dict:
        """The options of `attnbench data` given the composed ``task`` config (a config may say
        what a run expects, e.g. ListOps' ``task.generator``); by default those on the command line."""
        return options

    def check_options(self, options: dict) -> None:
        unknown = sorted(set(options) - set(self.options))
        if unknown:
            flags = ", ".join(f"--{o.replace('_', '-')}" for o in self.options) or "none"
            raise UserError(f"unknown option --{unknown[0].replace('_', '-')} for `attnbench data {self.name}`; "
                            f"valid: {flags}")


# name -> the fetcher (one instance each); its owner is the class's module. The core looks names up
# without discovering the families (it imports none): tasks.fetch.fetcher discovers them first.
FETCHERS: Registry[Fetcher] = Registry("dataset source")


def register_fetcher(cls: type[Fetcher]) -> type[Fetcher]:
    """Class decorator: register one instance of ``cls`` as ``cls.name``."""
    FETCHERS.register(cls.name, cls(), owner=cls.__module__)
    return cls
