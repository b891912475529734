"""Files written whole or not at all: the one way every command writes a file (records, claims,
reports, plots, caches, generated data, run folders' JSON). The content goes to a temporary file
beside the target, is synced, then renamed over it (``os.replace``): a kill at any moment leaves
the old file or the new one, never an empty or partial one. A symbolic link is written through
(its target is replaced, the link stays a link).

The temporary file is locked (``flock``) while it is written, so a process that finds one can tell
a write in progress from the leftover of a killed one (``remove_stale_temporaries``): the kernel
drops the lock when its process dies, however it dies."""
from __future__ import annotations

import fcntl
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
        _lock(fd, blocking=True)  # held until the file is closed: the write is in progress
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
    included) when it is not a writable folder; None when ``folder`` exists or can be made.
    Probed by creating a nameless file there: permission bits do not stop root, and an immutable
    folder, a read-only mount or /proc pass ``os.access``."""
    probe = Path(folder) if str(folder) else Path(".")
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if not (probe.is_dir() and os.access(probe, os.W_OK | os.X_OK)):
        return probe
    try:
        with tempfile.TemporaryFile(dir=probe):
            pass
    except OSError:
        return probe
    return None


STALE_AFTER_S = 60.0  # a temporary file younger than this may be between its creation and its lock


def remove_stale_temporaries(folder: str | Path, pattern: str) -> list[Path]:
    """Remove the files of ``folder`` matching ``pattern`` (temporary files of ``atomic_open``)
    that no process is writing: unlocked (their writer died: a kill during the write) and not
    modified for a minute; the paths removed. Best effort: a file that cannot be checked stays."""
    import time

    removed = []
    folder = Path(folder)
    if not folder.is_dir():
        return removed
    for path in sorted(folder.glob(pattern)):
        try:
            if not path.is_file() or path.is_symlink() or time.time() - path.stat().st_mtime < STALE_AFTER_S:
                continue
            with open(path, "rb") as f:
                if not _lock(f.fileno(), blocking=False):
                    continue  # a live process holds it: a write in progress
                path.unlink()
            removed.append(path)
        except OSError:
            continue
    return removed


def _lock(fd: int, blocking: bool) -> bool:
    """An exclusive ``flock`` on ``fd``; False when another process holds it (non-blocking)."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
    except BlockingIOError:
        return False
    except OSError:  # a filesystem without locks: the age alone decides
        return True
    return True


def _file_mode(path: Path) -> int:
    try:
        return stat.S_IMODE(path.stat().st_mode)
    except FileNotFoundError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask
