"""Result records: one CSV row per run, successful or not, with identity, metrics and provenance.

The file is never modified in place: each append writes the old rows plus the new one to a
temporary file in the same directory and atomically renames it over the original, under a
lock, so a crash mid-write (or two parallel jobs) cannot corrupt earlier rows. The same writer
(:func:`write_rows`) writes the CSVs of `attnbench profile`.
"""
from __future__ import annotations

import csv
import fcntl
import hashlib
import io
import json
import os
import platform
import stat
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from bench_cli.schema import COLUMNS, IDENTITY as _IDENTITY  # the schema names the columns

# Config parts that do not change a result: where things are written and how progress is shown.
_NON_SEMANTIC = ("paths", "results", "logger", "hydra", "report")
_NON_SEMANTIC_TRAINER = ("progress", "eval_batch_size", "num_threads")


# Keys added to the config after records were first written, with the value that reproduces the
# earlier behaviour: at that value they are left out of the keys below, so a config that does not
# use them keeps its job key and its earlier records still count as done. Append, never edit.
ADDED_KEYS: dict[str, object] = {
    "trainer.num_workers": 0,
    # issue 11: the Primal-Attention options of the authors' code (models/attention/primal.py) ...
    **{f"model.{role}.{option}": neutral for role in ("attention", "final_attention")
       for option, neutral in (("ksvd_form", "paper"), ("ksvd_square", "per_sample_head"), ("rows", "full"),
                               ("init", "per_head"), ("padding", "valid"), ("row_positions", "floor"))},
    "model.ksvd_layers": "sum",
    # ... and the UEA backbone options of their time-series code (models/timeseries.py)
    "task.backbone.attention_dropout": None,
    "task.backbone.final_norm": False,
    "task.backbone.attention_mask": True,
    "trainer.scheduler.warmup_init_lr": 0.0,
    "measure.inference_samples": None,
    "trainer.optimizer.lr_reference_batch": None,
    "trainer.optimizer.no_decay_1d": False,
    "trainer.scheduler.warmup_epochs": None,
    "trainer.scheduler.warmup_lr": None,
    "trainer.scheduler.min_lr": 0.0,
    "trainer.drop_last": False,
    "trainer.train_metrics": False,
    "trainer.strategy": "none",
    "trainer.precision": "32",
    "plugins": [],  # issue 23: the modules named change the run (another attention); none is the old config
}


# Values renamed after records were written, with the value the earlier records hashed, so a
# config that means the same keeps its job key. Append, never edit.
RENAMED_VALUES: dict[str, dict] = {
    "trainer.train_metrics": {"none": False, "batches": True},  # was a switch (false / true)
}


def _holder(tree: dict, dotted: str) -> tuple[dict | None, str]:
    """(the dict that holds ``dotted``'s last key, that key); None when a parent is missing."""
    *parents, leaf = dotted.split(".")
    node = tree
    for p in parents:
        node = node.get(p) if isinstance(node, dict) else None
    return (node if isinstance(node, dict) else None), leaf


def semantic_config(cfg: DictConfig | dict) -> dict:
    c = OmegaConf.to_container(cfg, resolve=True) if isinstance(cfg, DictConfig) else json.loads(json.dumps(cfg))
    for dotted, renamed in RENAMED_VALUES.items():
        node, leaf = _holder(c, dotted)
        if node is not None and isinstance(node.get(leaf), str) and node[leaf] in renamed:
            node[leaf] = renamed[node[leaf]]
    for k in _NON_SEMANTIC:
        c.pop(k, None)
    for k in _NON_SEMANTIC_TRAINER:
        c.get("trainer", {}).pop(k, None)
    for dotted, neutral in ADDED_KEYS.items():
        node, leaf = _holder(c, dotted)
        if node is not None and leaf in node and node[leaf] == neutral:
            del node[leaf]
    return c


def _digest(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]


def config_hash(cfg) -> str:
    """Hash of the resolved config that determines the result (seed included)."""
    return _digest(semantic_config(cfg))


def job_key(cfg) -> str:
    """Key of a sweep job for resume: the semantic config (with seed) minus measurement switches."""
    c = semantic_config(cfg)
    c.pop("measure", None)
    return _digest(c)


def variant_key(cfg) -> str:
    """``job_key`` without the seed: the runs a report aggregates over seeds share it."""
    c = semantic_config(cfg)
    c.pop("measure", None)
    c.pop("seed", None)
    return _digest(c)


PROJECT_ROOT = Path(__file__).resolve().parents[1]


def new_run_id() -> str:
    """A run's id: UTC time and a random suffix (unique for runs started in the same second)."""
    import uuid
    from datetime import datetime, timezone

    return f"{datetime.now(timezone.utc):%Y%m%dT%H%M%S}-{uuid.uuid4().hex[:6]}"


def _git(*args: str, root: Path = PROJECT_ROOT) -> str | None:
    try:
        out = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def git_state(root: Path = PROJECT_ROOT) -> tuple[str, str]:
    """(commit, dirty): dirty is "true" when code or configs differ from the commit, "" outside git.
    results/ holds generated reports and is ignored: a report written between two sweeps must not
    mark the second one's records dirty."""
    commit = _git("rev-parse", "HEAD", root=root)
    status = _git("status", "--porcelain", "--untracked-files=no", "--", ".", ":(exclude)results",
                  root=root) if commit else None
    return commit or "unknown", "" if status is None else str(bool(status)).lower()


def provenance() -> dict:
    """Where a result comes from: code, versions, platform, and the plugins of the process with
    their versions (imported by now: before composition, or right after it for ``plugins:``)."""
    from bench_cli import plugins

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


LOCK_NOTICE_AFTER_S = 2.0  # a lock held longer than this is announced (another process writes)


@contextmanager
def _locked(path: Path):
    """The CSV's lock file held exclusively. When another process holds it for more than a moment,
    one line on stderr says what is waiting for what, instead of a silent pause."""
    path.parent.mkdir(parents=True, exist_ok=True)
    lock_path = path.with_name(path.name + ".lock")
    with open(lock_path, "w") as lock:
        deadline = time.monotonic() + LOCK_NOTICE_AFTER_S
        while True:  # poll briefly; past the deadline say so once, then block
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    print(f"waiting for {lock_path} (another process is writing {path.name}; "
                          f"the record is written when it lets go)", file=sys.stderr, flush=True)
                    fcntl.flock(lock, fcntl.LOCK_EX)
                    break
                time.sleep(0.05)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def write_run_marker(run_dir: Path, row: dict) -> None:
    """``run.json`` in a run folder: which process runs it since when (a folder with it and
    without ``record.json`` is a run that was killed or is still going)."""
    import socket

    marker = {k: row.get(k) for k in ("run_id", "time", "task", "dataset", "model", "seed", "protocol",
                                       "experiment", "job_key")}
    marker.update(pid=os.getpid(), host=socket.gethostname())
    (Path(run_dir) / "run.json").write_text(json.dumps(marker, indent=1) + "\n")


def run_state(run_dir: Path) -> dict | None:
    """The state of a run folder: its record (finished, with status) or its marker with status
    'running' (the process is alive on this host) or 'killed' (started, never finished)."""
    run_dir = Path(run_dir)
    record, marker = run_dir / "record.json", run_dir / "run.json"
    if record.is_file():
        try:
            return {**json.loads(record.read_text()), "folder": str(run_dir)}
        except ValueError:
            pass
    if not marker.is_file():
        return None
    try:
        state = json.loads(marker.read_text())
    except ValueError:
        return None
    alive = False
    if state.get("host") == __import__("socket").gethostname():
        try:
            os.kill(int(state.get("pid", -1)), 0)
            alive = True
        except (OSError, ValueError):
            alive = False
    return {**state, "status": "running" if alive else "killed", "folder": str(run_dir)}


def run_folders(output_dir: Path) -> list[Path]:
    """Run folders under ``output_dir`` (runs/<date>/<id>/ and multirun/<date>/<id>/<job>/)."""
    root = Path(output_dir)
    found = [p.parent for p in root.glob("runs/*/*/config.yaml")] + [p.parent for p in root.glob("multirun/*/*/*/config.yaml")]
    return sorted(set(found), key=lambda p: p.stat().st_mtime)


def check_results_path(path: str | Path) -> None:
    """Before a run: ``path`` can take records -- its folder exists or can be made and is writable,
    and an existing file is an attnbench record file (its header starts with the record columns)."""
    from bench_cli.core.errors import UserError

    path = Path(path).resolve() if Path(path).is_symlink() else Path(path)  # a link is written through
    folder = path.parent if str(path.parent) else Path(".")
    probe = folder
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if not probe.is_dir() or not os.access(probe, os.W_OK | os.X_OK):
        raise UserError(f"results.path={path}: cannot write in {probe} (read-only or not a folder); "
                        f"choose another results.path=FILE")
    if path.exists():
        if not path.is_file():
            raise UserError(f"results.path={path} is not a file")
        with open(path, newline="", errors="replace") as f:
            first = f.readline().strip()
        header = first.split(",")
        if first and header[: len(_IDENTITY)] != list(_IDENTITY):
            raise UserError(f"results.path={path} is not an attnbench record file (its first line is not a record "
                            f"header); choose another results.path=FILE")
        if not os.access(path, os.W_OK):
            raise UserError(f"results.path={path} is read-only; choose another results.path=FILE")


def read_records(path: str | Path) -> list[dict]:
    path = Path(path)
    if not path.is_file():
        return []
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def write_rows(path: str | Path, rows: list[dict], columns: list[str] = COLUMNS, *, append: bool = True) -> None:
    """Write ``rows`` to the CSV at ``path``, after its rows (``append``) or instead of them.

    The one CSV writer (run records, profile points). Under the lock, the whole file is written to a
    temporary file in the same directory and renamed over the original, so a crash mid-write or a
    parallel writer cannot corrupt earlier rows. The header is the file's own (when appending),
    then ``columns`` it lacks, then every other key in the order it first appears: unknown keys
    become new columns at the end and older rows get blanks; existing columns never move. A
    symbolic link is written through: its target gets the rows and the link stays a link.
    """
    path = Path(path)
    if path.is_symlink():
        path = path.resolve()
    with _locked(path):
        old = read_records(path) if append else []
        rows = old + list(rows)
        header = list(old[0]) if old else []
        header += [c for c in columns if c not in header]
        for r in rows:
            header += [k for k in r if k not in header]
        buf = io.StringIO()
        writer = csv.DictWriter(buf, fieldnames=header, extrasaction="raise", lineterminator="\n")
        writer.writeheader()
        for r in rows:
            writer.writerow({k: _cell(r.get(k)) for k in header})
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
        try:
            # mkstemp creates 0600: keep the existing file's mode, or the umask's for a new file
            os.fchmod(fd, _file_mode(path))
            with os.fdopen(fd, "w", newline="") as f:
                f.write(buf.getvalue())
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise


def _file_mode(path: Path) -> int:
    try:
        return stat.S_IMODE(path.stat().st_mode)
    except FileNotFoundError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


def append_record(path: str | Path, row: dict) -> None:
    """Append one run record (``COLUMNS`` first)."""
    write_rows(path, [row])


def _cell(v) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return repr(v)
    if isinstance(v, (dict, list)):
        return json.dumps(v, sort_keys=True, default=str)
    return str(v)


def command_line() -> str:
    return " ".join(sys.argv[1:])


COMMAND_ENV = "ATTNBENCH_COMMAND"


def invocation() -> str:
    """The command the user typed (``attnbench sweep ...`` with its launcher options), set by the
    CLI before Hydra rewrites ``sys.argv``; inherited by a sweep's worker processes."""
    return os.environ.get(COMMAND_ENV) or "attnbench " + command_line()
