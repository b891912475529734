"""What a Hydra config repository's sources hold, as one comparable value: ``repository_fingerprint``.

A composition depends on its search path's sources and on nothing else that Hydra reads before
applying the value overrides: the config files of each folder and package (their names, the
folders that are config groups, their texts) and the structured configs of Hydra's ConfigStore.
Two compositions with equal fingerprints read the same configs, so a composition remembered under
one (hydra_private.py ``remember_compositions``) is the one Hydra would compose again. The texts
are hashed, not their time stamps: a file rewritten with the same size and modification time is
still another config.
"""
from __future__ import annotations

import hashlib
import importlib.resources
import os
import pathlib

# What Hydra's file and package sources read (hydra/plugins/config_source.py
# ``_normalize_file_name``): ``.yaml``, and ``.yml`` under a version_base before 1.2 (attnbench's
# is 1.3, but a ``.yml`` file hashed for nothing costs only a composition made anew).
CONFIG_SUFFIXES = (".yaml", ".yml")
MAX_DEPTH = 32  # folders below a source's root, deeper than any config group

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
            digest.update(b"f\0" + name + b"\0" + _read(entry.path) + b"\0\0")


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
