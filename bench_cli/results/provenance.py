"""Where a result comes from: the commit and whether the tree was clean, the versions, the
platform, the plugins, and the command the user typed."""
from __future__ import annotations

import os
import platform
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[2]


def git(*args: str, root: Path = PROJECT_ROOT) -> str | None:
    """What ``git ARGS`` prints in ``root`` (stripped); None outside git or when it fails."""
    try:
        out = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def git_state(root: Path = PROJECT_ROOT) -> tuple[str, str]:
    """(commit, dirty): dirty is "true" when code or configs differ from the commit, "" outside git.
    results/ holds generated reports and is ignored: a report written between two sweeps must not
    mark the second one's records dirty."""
    commit = git("rev-parse", "HEAD", root=root)
    status = git("status", "--porcelain", "--untracked-files=no", "--", ".", ":(exclude)results",
                 root=root) if commit else None
    return commit or "unknown", "" if status is None else str(bool(status)).lower()


def provenance() -> dict:
    """Where a result comes from: code, versions, platform, and the plugins of the process with
    their versions (imported by now: before composition, or right after it for ``plugins:``)."""
    from bench_cli.config import plugins

    return {**_environment(), "plugins": plugins.describe()}


@lru_cache(maxsize=1)
def _environment() -> dict:
    import torch

    from bench_cli import __version__

    commit, dirty = git_state()
    return {
        "git_commit": commit,
        "git_dirty": dirty,
        "torch_version": torch.__version__,
        "attnbench_version": __version__,
        "python_version": platform.python_version(),
        "platform": f"{platform.system()}-{platform.machine()}",
    }


def command_line() -> str:
    return " ".join(sys.argv[1:])


COMMAND_ENV = "ATTNBENCH_COMMAND"


def invocation() -> str:
    """The command the user typed (``attnbench sweep ...`` with its launcher options), set by the
    CLI before Hydra rewrites ``sys.argv``; inherited by a sweep's worker processes."""
    return os.environ.get(COMMAND_ENV) or "attnbench " + command_line()
