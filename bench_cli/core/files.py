"""Files written whole or not at all: the one way every command writes a file (records, claims,
reports, plots, caches, generated data, run folders' JSON). The content goes to a temporary file
beside the target, is synced, then renamed over it (``os.replace``): a kill at any moment leaves
the old file or the new one, never an empty or partial one. A symbolic link is written through
(its target is replaced, the link stays a link)."""
from __future__ import annotations

import os
import stat
import tempfile
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def atomic_open(path: str | Path, mode: str = "w", **kwargs):
    """``open(path, mode)`` for writing (``"w"`` or ``"wb"``), made atomic: the file appears at
    ``path`` only when the block ends without an error. Keeps an existing file's permissions
    (a new file gets the umask's, as ``open`` would)."""
    if mode not in ("w", "wb"):
        raise ValueError(f"atomic_open writes whole files: mode 'w' or 'wb', not {mode!r}")
    path = Path(path)
    path = path.resolve() if path.is_symlink() else path
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    try:
        os.fchmod(fd, _file_mode(path))  # mkstemp creates 0600
        with os.fdopen(fd, mode, **kwargs) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_atomically(path: str | Path, data: str | bytes, encoding: str = "utf-8") -> None:
    """``path`` holds ``data`` (text written as is, no newline translation, or bytes)."""
    if isinstance(data, bytes):
        with atomic_open(path, "wb") as f:
            f.write(data)
    else:
        with atomic_open(path, "w", encoding=encoding, newline="") as f:
            f.write(data)


def unwritable_folder(folder: str | Path) -> Path | None:
    """Where files cannot be created under ``folder``: the nearest existing ancestor (itself
    included) when it is not a writable folder; None when ``folder`` exists or can be made."""
    probe = Path(folder) if str(folder) else Path(".")
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    return None if probe.is_dir() and os.access(probe, os.W_OK | os.X_OK) else probe


def _file_mode(path: Path) -> int:
    try:
        return stat.S_IMODE(path.stat().st_mode)
    except FileNotFoundError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask
