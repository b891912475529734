"""Looking up dataset fetchers by name (`attnbench data NAME`, `ls datasets`): the families are
discovered first, so every fetcher is registered. The Fetcher base, its registry and
``register_fetcher`` are in the core layer (bench_cli/core/fetch.py)."""
from __future__ import annotations

from bench_cli.core.fetch import FETCHERS, Fetcher


def available_fetchers() -> list[str]:
    from attnbench.tasks import discover

    discover()
    return FETCHERS.names()


def fetcher(name: str) -> Fetcher:
    available_fetchers()
    return FETCHERS.get(name)
