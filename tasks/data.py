"""Data helpers every task family uses: downloads with checksums, archives, a cache of
preprocessed splits, train/validation splits and padding. One copy each, so a fix (say, a
download that fails half-way) lands in every family at once.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import tarfile
import zipfile
from pathlib import Path
from collections.abc import Callable

import numpy as np
import torch

from bench_cli.core.errors import DataNotFoundError, warn_once
from bench_cli.core.extras import require
from bench_cli.core.files import atomic_open, write_atomically

CACHE_VERSION = 1  # bump when a family's preprocessing changes (it is part of every cache key)


# --- downloads ------------------------------------------------------------------------------------
def file_digest(path: Path, algorithm: str = "sha256") -> str:
    h = hashlib.new(algorithm)
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


# HTTP statuses worth another try: the server is busy or the request timed out; any other 4xx/5xx
# is the server refusing, and retrying would not change its answer.
TRANSIENT_STATUSES = {408, 425, 429, 500, 502, 503, 504}


class _Transient(Exception):
    """A failure another attempt may get past (a dropped connection, a timeout, a busy server)."""


def _is_transient(err: BaseException) -> bool:
    import http.client
    import socket
    import urllib.error

    if isinstance(err, urllib.error.HTTPError):
        return err.code in TRANSIENT_STATUSES
    if isinstance(err, urllib.error.URLError):  # the connection's own error, wrapped
        err = err.reason if isinstance(err.reason, BaseException) else err
        if isinstance(err, socket.gaierror):  # no such host, or no network: retrying will not help
            return False
    return isinstance(err, (TimeoutError, ConnectionError, http.client.IncompleteRead, http.client.RemoteDisconnected))


def download(url: str, target: Path, *, what: str, where: str, md5: str | None = None,
             sha256: str | None = None, size: int | None = None, timeout: float = 60, attempts: int = 6,
             backoff_s: float = 2.0) -> str:
    """Download ``url`` to ``target`` and return its sha256; ``<target>.sha256`` is written beside it.

    The bytes go to ``<target>.part``, which an interrupted transfer leaves behind: the next attempt
    (and the next `attnbench data`) asks for the rest with an HTTP Range request, and starts over
    when the server ignores the Range. A part is resumed only when what it holds can be told to be
    the start of the same file: the download has a checksum (checked at the end), or the part was
    begun by this call, or the server gave the file a validator (a strong ETag or Last-Modified,
    kept in ``<target>.part.validator``) that the request sends as ``If-Range`` (RFC 9110 13.1.5:
    the server sends the whole file when it has changed). Otherwise, and when the server answers
    416 without a size the part matches, the part is discarded and the file fetched from its first
    byte: a stale part is never spliced onto a newer file, nor an oversized one moved into place.
    A dropped connection, a timeout or a busy server (HTTP 408, 429, 5xx) is retried ``attempts``
    times in all, waiting ``backoff_s`` doubled at each retry. The size (``size``, else the
    server's Content-Length) and ``md5``/``sha256`` are checked before the file is moved into
    place; a mismatch removes the partial file. Progress: bytes, speed, ETA.

    Raises DataNotFoundError (one line: what failed, and where the file must go instead). Why not a
    library: pooch has no resume of a partial file, and huggingface_hub's resuming ``http_get`` is
    an internal helper of a package only the text extra installs, while every family downloads."""
    import time

    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    part = Part(target.with_name(target.name + ".part"), url, trusted=bool(md5 or sha256))
    instead = f"fetch it by hand and put it so that {where} exists ({what})"
    for attempt in range(attempts):
        try:
            total = _fetch_into(url, part, what, timeout, instead)
            break
        except _Transient as e:
            if attempt + 1 == attempts:
                raise DataNotFoundError(f"cannot download {url} after {attempts} attempts ({e}); run the command "
                                        f"again to resume from {part.size()} bytes, or {instead}") from None
            time.sleep(backoff_s * 2 ** attempt)
    part = part.path
    got, expected = part.stat().st_size, size if size is not None else total
    if expected is not None and got != expected:
        part.unlink(missing_ok=True)
        raise DataNotFoundError(f"corrupt download {url} ({got} bytes, expected {expected}); removed, run the command again")
    for algorithm, digest in (("md5", md5), ("sha256", sha256)):
        if digest and file_digest(part, algorithm) != digest:
            part.unlink(missing_ok=True)
            raise DataNotFoundError(f"corrupt download {url} ({algorithm} differs from {digest}); removed, "
                                    f"run the command again")
    os.replace(part, target)
    Part.validator_file(part).unlink(missing_ok=True)
    digest = file_digest(target)
    write_atomically(target.with_name(target.name + ".sha256"), f"{digest}  {target.name}\n")
    return digest


class Part:
    """A download's partial file and whether its bytes may be resumed (``download``)."""

    def __init__(self, path: Path, url: str, trusted: bool):
        self.path, self.url = path, url
        self.trusted = trusted  # a checksum will catch a part of another version of the file
        self.begun_here = False  # written by this download call: of the file the server sends now

    @staticmethod
    def validator_file(path: Path) -> Path:
        return path.with_name(path.name + ".validator")

    def size(self) -> int:
        return self.path.stat().st_size if self.path.is_file() else 0

    def validator(self) -> str | None:
        """The ETag or Last-Modified of the response that began the part (same URL), else None."""
        try:
            kept = json.loads(self.validator_file(self.path).read_text())
        except (OSError, ValueError):
            return None
        return kept.get("validator") if isinstance(kept, dict) and kept.get("url") == self.url else None

    def resumable(self) -> tuple[int, dict]:
        """(bytes to resume from, the request's headers); a part that cannot be told to be of the
        file the server has now is discarded (0, no Range)."""
        have, validator = self.size(), self.validator()
        if have and not (self.trusted or self.begun_here or validator):
            warn_once(f"warning: discarding {self.path} ({have} bytes): without a checksum or a validator from the server "
                      "it cannot be told to be the start of the same file; downloading it from the start")
            self.discard()
            return 0, {}
        if not have:
            return 0, {}
        return have, {"Range": f"bytes={have}-", **({"If-Range": validator} if validator else {})}

    def begin(self, headers) -> None:
        """The server sends the file from its first byte: keep its validator for a later resume."""
        self.begun_here = True
        etag, modified = headers.get("ETag"), headers.get("Last-Modified")
        validator = etag if etag and not etag.startswith("W/") else modified  # If-Range takes strong ETags only
        if validator:
            write_atomically(self.validator_file(self.path), json.dumps({"url": self.url, "validator": validator}))
        else:
            self.validator_file(self.path).unlink(missing_ok=True)

    def discard(self) -> None:
        self.path.unlink(missing_ok=True)
        self.validator_file(self.path).unlink(missing_ok=True)
        self.begun_here = False


def _fetch_into(url: str, part: Part, what: str, timeout: float, instead: str) -> int | None:
    """One attempt: append the rest of ``url`` to ``part`` (from its current size, by an HTTP Range
    request), or write it afresh when the server sends the whole file. Returns the file's size when
    the server said it. _Transient for failures worth retrying, DataNotFoundError for a refusal."""
    import urllib.error
    import urllib.request

    from bench_cli.core.progress import count_progress

    have, headers = part.resumable()
    request = urllib.request.Request(url, headers=headers)
    try:
        response = urllib.request.urlopen(request, timeout=timeout)
    except urllib.error.HTTPError as e:
        if e.code == 416 and have:  # nothing after `have`: the part is the whole file only if the sizes agree
            total = (e.headers.get("Content-Range") or "").rpartition("/")[2]
            if total.isdigit() and int(total) == have:
                return have
            part.discard()  # no size, or another: an oversized or stale part, fetched again from byte 0
            raise _Transient(f"HTTP 416 for the {have} bytes already here (the file is "
                             f"{total + ' bytes' if total.isdigit() else 'of unknown size'}): downloading it again") from None
        if _is_transient(e):
            raise _Transient(f"HTTP {e.code} {e.reason}") from None
        raise DataNotFoundError(f"the server refused {url} (HTTP {e.code} {e.reason}); {instead}") from None
    except OSError as e:
        if _is_transient(e):
            raise _Transient(str(getattr(e, "reason", e))) from None
        raise DataNotFoundError(f"cannot download {url} ({getattr(e, 'reason', e)}); {instead}") from None
    with response:
        resumed = response.status == 206 and _range_start(response.headers.get("Content-Range")) == have
        if response.status == 206 and not resumed:  # a part of the file from elsewhere: nothing to append
            part.discard()
            raise _Transient(f"the server sent bytes {response.headers.get('Content-Range')}, not from {have}")
        start = have if resumed else 0  # a 200 to a Range request: the whole file again, from byte 0
        if not resumed:
            part.begin(response.headers)
        length = response.headers.get("Content-Length")
        total = start + int(length) if length is not None else None
        done = start
        try:
            with open(part.path, "ab" if resumed else "wb") as f, \
                    count_progress(what, total or 0, in_bytes=True, start=start) as shown:
                for block in iter(lambda: response.read(1 << 20), b""):
                    f.write(block)
                    done += len(block)
                    shown(done, total or 0)
        except OSError as e:  # the connection dropped mid-body (what was written stays in the part)
            raise _Transient(f"connection lost after {done} bytes: {e}") from None
        if total is not None and done < total:  # the server closed early without an error
            raise _Transient(f"connection closed after {done} of {total} bytes")
    return total


def _range_start(content_range: str | None) -> int | None:
    """The first byte of a ``Content-Range: bytes START-END/TOTAL`` header."""
    try:
        return int(content_range.split()[1].split("-")[0])
    except (AttributeError, IndexError, ValueError):
        return None


def unpack(archive: Path, into: Path, members: Callable[[str], str | None] | None = None) -> None:
    """Unpack a tar (any compression) or zip archive into ``into``. ``members(name)`` may map a
    member's name to the file name to write (flattening), or None to skip it; a zip's CRCs are
    checked first."""
    archive, into = Path(archive), Path(into)
    into.mkdir(parents=True, exist_ok=True)
    if zipfile.is_zipfile(archive):
        with zipfile.ZipFile(archive) as z:
            bad = z.testzip()
            if bad is not None:
                raise DataNotFoundError(f"corrupt archive {archive}: CRC mismatch in {bad}; download it again")
            for name in z.namelist():
                out = members(name) if members else name
                if out and not name.endswith("/"):
                    dest = into / out
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    write_atomically(dest, z.read(name))
        return
    with tarfile.open(archive, "r:*") as tar:
        if members is not None:
            for m in tar.getmembers():
                out = members(m.name)
                if out and m.isfile():
                    dest = into / out
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    write_atomically(dest, tar.extractfile(m).read())
        elif sys.version_info >= (3, 12) or hasattr(tarfile, "data_filter"):
            tar.extractall(into, filter="data")
        else:  # pragma: no cover - old Pythons
            tar.extractall(into)


def fresh_folder(target: Path):
    """Context for filling a dataset folder: if filling fails, a folder that did not exist before
    is removed again (an empty or half-written dataset folder would look like data)."""
    return _FreshFolder(Path(target))


class _FreshFolder:
    def __init__(self, target: Path):
        self.target, self.existed = target, target.exists()

    def __enter__(self) -> Path:
        self.target.mkdir(parents=True, exist_ok=True)
        return self.target

    def __exit__(self, kind, value, tb):
        if kind is not None and not self.existed:
            shutil.rmtree(self.target, ignore_errors=True)
        return False


# --- Hugging Face datasets -------------------------------------------------------------------------
HF_ENDPOINT = "https://huggingface.co"
_TRUE = ("1", "true", "yes", "on")


def hf_offline() -> bool:
    """The user asked for offline mode (HF_HUB_OFFLINE / HF_DATASETS_OFFLINE)."""
    return any(os.environ.get(v, "").lower() in _TRUE for v in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"))


def hf_cache_folders(repo: str) -> list[Path]:
    """Where a cached copy of the hub dataset ``repo`` would be: the datasets cache
    (``<org>___<name>``) and the hub cache (``datasets--<org>--<name>``), after HF's variables."""
    home = Path(os.environ.get("HF_HOME") or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "huggingface")
    datasets_cache = Path(os.environ.get("HF_DATASETS_CACHE") or home / "datasets")
    hub_cache = Path(os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE") or home / "hub")
    return [datasets_cache / repo.replace("/", "___"), hub_cache / f"datasets--{repo.replace('/', '--')}"]


def hf_cache_copy(repo: str) -> Path | None:
    """The folder of a cached copy of the hub dataset ``repo`` (:func:`hf_cache_folders`), or None."""
    return next((p for p in hf_cache_folders(repo) if p.is_dir()), None)


def load_hf_dataset(path: str, config: str | None = None, *, missing: str, **kwargs):
    """``datasets.load_dataset(path, config)`` from the HF cache or the hub. When offline mode is
    set, or the hub does not answer within seconds, only the local cache is tried, so a missing
    dataset is one line at once (``missing`` says what to do) instead of half a minute of retries."""
    import sys

    from bench_cli.core.net import reachable

    if hf_offline() and not any(p.is_dir() for p in hf_cache_folders(path)):  # answer at once, no import
        raise DataNotFoundError(f"{missing} (offline: HF_DATASETS_OFFLINE/HF_HUB_OFFLINE are set and the "
                                f"HF cache has no copy of {path})")
    offline = hf_offline() or not reachable(os.environ.get("HF_ENDPOINT", HF_ENDPOINT))
    if offline:
        os.environ["HF_HUB_OFFLINE"] = os.environ["HF_DATASETS_OFFLINE"] = "1"
        for module, attr in (("huggingface_hub.constants", "HF_HUB_OFFLINE"), ("datasets.config", "HF_HUB_OFFLINE"),
                             ("datasets.config", "HF_DATASETS_OFFLINE")):
            if module in sys.modules and hasattr(sys.modules[module], attr):  # read at import time
                setattr(sys.modules[module], attr, True)
    datasets = require("datasets", "text", f"{path} from the HF hub")
    try:
        return datasets.load_dataset(path, config, **kwargs)
    except Exception as e:  # noqa: BLE001 - not cached / hub errors: one line
        first = str(e).strip().splitlines()[0][:160] if str(e).strip() else type(e).__name__
        where = "offline, and not in the HF cache" if offline else first
        raise DataNotFoundError(f"{missing} ({where})") from None


# --- cache of preprocessed splits -----------------------------------------------------------------
def file_signature(paths) -> list:
    """Identity of source files for a cache key: path, size, modification time."""
    out = []
    for p in paths:
        st = Path(p).stat()
        out.append([str(p), st.st_size, st.st_mtime_ns])
    return out


def _cache_blob(key: dict) -> str:
    return json.dumps({"version": CACHE_VERSION, **key}, sort_keys=True, default=str)


def cache_path(cache_root: Path, name: str, key: dict) -> Path:
    """The file ``cached`` uses for ``key`` (to ask whether a dataset is cached without loading it)."""
    return Path(cache_root).expanduser() / f"{name}-{hashlib.sha256(_cache_blob(key).encode()).hexdigest()[:16]}.pt"


def cached(cache_root: Path, name: str, key: dict, build: Callable[[], object]):
    """Load what ``build()`` made for ``key`` from ``cache_root``, or build and store it (atomically,
    readable by the group like the data root). Returns (data, path).

    An entry is the data with its key and its structure (types, nesting, tensor dtypes and ranks:
    ``structure``); one whose key or structure does not match (another version's format, a file
    put there by hand, a torn or foreign file) is a miss: rebuilt, with a warning. The cache is an
    optimisation: when it cannot be written (a read-only data root), that is said once and the
    data built from the source is used."""
    blob = _cache_blob(key)
    path = cache_path(cache_root, name, key)
    if path.is_file():
        try:
            entry = torch.load(path, weights_only=True)
            problem = None if _valid_entry(entry, blob) else "not an entry of this key (another version's, or foreign)"
        except Exception as e:  # noqa: BLE001 - any unreadable cache is rebuilt
            problem = f"unreadable ({type(e).__name__})"
        if problem is None:
            return entry["data"], path
        warn_once(f"warning: cache {path} is {problem}: rebuilt from the source files")
    data = build()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_open(path, "wb") as f:
            torch.save({"key": blob, "structure": structure(data), "data": data}, f)
        write_atomically(path.with_suffix(".json"), blob + "\n")
    except OSError as e:
        warn_once(f"note: cannot write the cache in {path.parent} ({e.strerror or e}); the data is read from "
                   f"the source files each time (make the folder writable to cache it)")
    return data, path


def structure(data) -> object:
    """What a cache entry must look like: containers with their keys (dicts) or element kinds,
    tensors and arrays with their dtype and rank, other values with their type; sizes are the
    data's own. Long sequences are described by their first and last elements, so that checking
    an entry costs little next to loading it."""
    if isinstance(data, dict):
        return {str(k): structure(v) for k, v in data.items()}
    if isinstance(data, tuple) and len(data) <= 8:
        return ["tuple", *(structure(v) for v in data)]
    if isinstance(data, (list, tuple)):
        ends = data[:3] + data[-3:] if len(data) > 6 else data
        kinds = {json.dumps(structure(v), sort_keys=True) for v in ends}
        return [type(data).__name__ + " of", *sorted(kinds)]
    if isinstance(data, torch.Tensor):
        return f"tensor {data.dtype} rank {data.dim()}"
    if isinstance(data, np.ndarray):
        return f"array {data.dtype} rank {data.ndim}"
    return type(data).__name__


def _valid_entry(entry, blob: str) -> bool:
    return (isinstance(entry, dict) and set(entry) == {"key", "structure", "data"} and entry["key"] == blob
            and entry["structure"] == structure(entry["data"]))


# --- splits ---------------------------------------------------------------------------------------
def stratified_split(labels: np.ndarray, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Indices (fit, val): ``fraction`` of every class (at least one sample of classes with >= 2) to val."""
    rng = np.random.RandomState(seed)
    fit, val = [], []
    for cls in np.unique(labels):
        idx = np.flatnonzero(labels == cls)
        rng.shuffle(idx)
        k = int(round(fraction * len(idx)))
        k = min(max(k, 1), len(idx) - 1) if len(idx) >= 2 else 0
        val += idx[:k].tolist()
        fit += idx[k:].tolist()
    return np.sort(fit), np.sort(val)


def random_split(n: int, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(fit, val): a random ``fraction`` of ``range(n)`` held out (regression, or no labels)."""
    perm = np.random.RandomState(seed).permutation(n)
    k = int(round(fraction * n))
    return np.sort(perm[k:]), np.sort(perm[:k])


def validation_split(cfg, n: int, labels: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The holdout protocol's validation split carved from TRAIN, as every family makes it: indices
    (fit, val) of its ``n`` samples, ``task.val_fraction`` (default 0.1) held out with
    ``task.split_seed`` (default 0); per class (``stratified_split``) when ``labels`` are given,
    else uniformly (``random_split``). Datasets with an official validation split use that instead."""
    fraction, seed = float(cfg.get("val_fraction", 0.1)), int(cfg.get("split_seed", 0))
    if labels is not None:
        return stratified_split(np.asarray(labels), fraction, seed)
    return random_split(n, fraction, seed)


# --- padding ----------------------------------------------------------------------------------------
def pad_series(series: list[np.ndarray], max_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Zero-pad or truncate (length, channels) arrays to ``max_len``; mask is True on real steps."""
    n, c = len(series), series[0].shape[1]
    x = np.zeros((n, max_len, c), dtype=np.float32)
    mask = np.zeros((n, max_len), dtype=bool)
    for i, s in enumerate(series):
        k = min(len(s), max_len)
        x[i, :k], mask[i, :k] = s[:k], True
    return torch.from_numpy(x), torch.from_numpy(mask)


def pad_rows(rows, seq_len: int, dtype=torch.int16) -> torch.Tensor:
    """Token id rows right-padded with 0 (or truncated) to ``seq_len``."""
    out = torch.zeros(len(rows), seq_len, dtype=dtype)
    for i, r in enumerate(rows):
        r = np.asarray(r)[:seq_len]
        out[i, : len(r)] = torch.from_numpy(r.astype(np.int64)).to(dtype)
    return out


def collate_padded(items: list[dict], pad_values: dict | None = None) -> dict:
    """Collate samples whose tensors may differ in their first dimension (variable-length
    sequences): each key is right-padded to the batch's longest with ``pad_values[key]`` (0 by
    default), and ``<key>_mask`` (True on real positions) is added for every padded key. Scalars
    and equal shapes stack as usual."""
    pad_values = pad_values or {}
    out = {}
    for key in items[0]:
        values = [it[key] for it in items]
        if not torch.is_tensor(values[0]):
            out[key] = values
            continue
        if values[0].dim() == 0 or len({v.shape for v in values}) == 1:
            out[key] = torch.stack(values)
            continue
        length = max(v.shape[0] for v in values)
        padded = values[0].new_full((len(values), length, *values[0].shape[1:]), pad_values.get(key, 0))
        mask = torch.zeros(len(values), length, dtype=torch.bool)
        for i, v in enumerate(values):
            padded[i, : v.shape[0]], mask[i, : v.shape[0]] = v, True
        out[key], out[f"{key}_mask"] = padded, mask
    return out


