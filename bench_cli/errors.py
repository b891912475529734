"""Errors a user can make. Each prints as one line and exits with status 2, no traceback."""
from __future__ import annotations

import difflib

EXIT_USAGE = 2


class UserError(Exception):
    """A mistake in the command line, the config or the data location."""

    exit_code = EXIT_USAGE


class DataNotFoundError(UserError):
    """A dataset is not available locally; the message says where to put it and how to fetch it."""


def did_you_mean(name: str, choices) -> str:
    close = difflib.get_close_matches(str(name), [str(c) for c in choices], n=1, cutoff=0.5)
    return f" (did you mean '{close[0]}'?)" if close else ""


def unknown_choice(kind: str, name: str, choices) -> UserError:
    choices = sorted(choices)
    return UserError(f"unknown {kind} '{name}'{did_you_mean(name, choices)}; valid: {', '.join(choices)}")
