"""What a Hydra config repository's sources hold, as one comparable value: ``repository_fingerprint``.

A composition depends on its search path's sources and on nothing else that Hydra reads before
applying the value overrides: the config files of each folder and package (their names, the
folders that are config groups, their texts) and the structured configs of Hydra's ConfigStore.
Two compositions with equal fingerprints read the same configs, so a composition remembered under
one (hydra_private.py ``remember_compositions``) is the one Hydra would compose again. The texts
are hashed, not their time stamps: a file rewritten with the same size and modification time is
still another config.

A file's text is read again only when it may have changed since it was last read (``_text_digest``:
git's rule for "racily clean" index entries): its identity and times (inode, size, modification and
change times, all in nanoseconds) are those of that read, and that read came more than
``SETTLED_S`` after the last of those times. Any write or ``utime`` sets the change time to the
clock's now, so it differs from times older than a clock tick; a file read within ``SETTLED_S`` of
its last change is read each time, as a write in the same tick would keep its times. A fingerprint
of conf/ and Hydra's own configs (136 files) took 2.8 ms reading every text, 1.5 ms with ``stat``
in their place.
"""
from __future__ import annotations

import hashlib
import importlib.resources
import os
import pathlib
import time

# What Hydra's file and package sources read (hydra/plugins/config_source.py
# ``_normalize_file_name``): ``.yaml``, and ``.yml`` under a version_base before 1.2 (attnbench's
# is 1.3, but a ``.yml`` file hashed for nothing costs only a composition made anew).
CONFIG_SUFFIXES = (".yaml", ".yml")
MAX_DEPTH = 32  # folders below a source's root, deeper than any config group
# A text read this long after the last change of its file is not read again while the file keeps its
# identity and times: longer than any filesystem's time stamp granularity (ext4, tmpfs: the kernel's
# clock tick, 1-10 ms; FAT's 2 s is not a filesystem configs live on)
SETTLED_S = 2.0
# path -> (its stat signature, whether that read came SETTLED_S after the signature's times, the
# digest of its text as _read returns it); a few hundred entries
_text_digests: dict[str, tuple] = {}

# The ConfigStore nodes a fingerprint has named, kept alive so that no later node takes the id() of
# one that was replaced (a handful: Hydra's own, the launchers' and sweepers' configs).
_store_nodes: dict[int, object] = {}


def repository_fingerprint(repository) -> tuple | None:
    """(scheme, path, digest of what it holds) per source of ``repository`` in search order; None
    when a source is of a kind whose contents cannot be read here (a plugin's own scheme), so that
    nothing is remembered for it."""
    parts = []
    for source in repository.get_sources():
        scheme = source.scheme()
        if scheme == "file":
            digest = folder_digest(pathlib.Path(source.path))
        elif scheme == "pkg":
            digest = package_digest(source.path)
        elif scheme == "structured":
            digest = store_digest(getattr(source, "store", None))
        else:
            return None
        if digest is None:
            return None
        parts.append((scheme, str(source.path), digest))
    return tuple(parts)


def folder_digest(root: pathlib.Path) -> str:
    """A digest of every config file's path and text under ``root`` and of its folders' names
    ('' when ``root`` is not a folder: Hydra finds nothing there either)."""
    if not root.is_dir():
        return ""
    digest = hashlib.blake2b(digest_size=16)
    _digest_folder(str(root), b"", digest, depth=0)
    return digest.hexdigest()


def _digest_folder(folder: str, relative: bytes, digest, depth: int) -> None:
    # os.scandir and os.read: a composition reads the fingerprint of its whole search path (conf/
    # has 124 files), so the plain calls, at a few microseconds a file
    if depth > MAX_DEPTH:  # a folder linked into itself: its name stands for what lies deeper
        return
    try:
        with os.scandir(folder) as listing:
            entries = sorted(listing, key=lambda entry: entry.name)
    except OSError:
        return
    for entry in entries:
        name = relative + entry.name.encode()
        if entry.is_dir():
            digest.update(b"d\0" + name + b"\0")
            _digest_folder(entry.path, name + b"/", digest, depth + 1)
        elif entry.name.endswith(CONFIG_SUFFIXES):
            digest.update(b"f\0" + name + b"\0" + _text_digest(entry) + b"\0\0")


def _text_digest(entry: os.DirEntry) -> bytes:
    """The digest of the file's text (``_read``), read again only where it may have changed since
    the last read (the module's docstring)."""
    try:
        stat = entry.stat()
    except OSError:
        return _read(entry.path)
    signature = (stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns)
    kept = _text_digests.get(entry.path)
    if kept is not None and kept[0] == signature and kept[1]:
        return kept[2]
    text = hashlib.blake2b(_read(entry.path), digest_size=16).digest()
    settled = time.time_ns() - max(stat.st_mtime_ns, stat.st_ctime_ns) > SETTLED_S * 1e9
    _text_digests[entry.path] = (signature, settled, text)
    return text


def _read(path: str) -> bytes:
    """The file's bytes, length first (so no text can end where another begins); an unreadable
    file is its error's name (Hydra's read of it fails as well)."""
    try:
        descriptor = os.open(path, os.O_RDONLY)
    except OSError as error:
        return type(error).__name__.encode()
    try:
        chunks = []
        while chunk := os.read(descriptor, 1 << 20):
            chunks.append(chunk)
    finally:
        os.close(descriptor)
    text = b"".join(chunks)
    return len(text).to_bytes(8, "little") + text


def package_digest(module: str) -> str | None:
    """``folder_digest`` of an installed package's folder (``pkg://hydra.conf``); a package that is
    not a plain folder (a zip) cannot change while the process runs: its name stands for it. None
    when the package cannot be found (Hydra's own lookup then decides what to say)."""
    try:
        root = importlib.resources.files(module)
    except (ModuleNotFoundError, TypeError, ValueError):
        return None
    return folder_digest(root) if isinstance(root, pathlib.Path) else f"package:{module}"


def store_digest(store) -> tuple | None:
    """The ConfigStore's entries, each as its path and the identity of its node (a node stored again
    is a new object). None for a source without a ConfigStore."""
    repo = getattr(store, "repo", None)
    if not isinstance(repo, dict):
        return None
    entries = []

    def walk(tree: dict, path: str) -> None:
        for name in sorted(tree):
            node = tree[name]
            if isinstance(node, dict):
                walk(node, f"{path}/{name}")
            else:
                _store_nodes.setdefault(id(node), node)
                entries.append((f"{path}/{name}", id(node)))

    walk(repo, "")
    return tuple(entries)
