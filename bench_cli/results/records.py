"""Result records: one CSV row per run, successful or not, with identity, metrics and provenance.

The file is never modified in place: each append writes the old rows plus the new one to a
temporary file in the same directory and atomically renames it over the original, under a
lock, so a crash mid-write (or two parallel jobs) cannot corrupt earlier rows. The same writer
(:func:`write_rows`) writes the CSVs of `attnbench profile`. Every reader reads strictly
(:func:`read_table`): a corrupt row is an error naming its line, never rows silently absorbed.
Sweeps claim each job under the same lock before running it (:func:`claim_job`), so two sweeps
of one file never run a job twice.
"""
from __future__ import annotations

import csv
import fcntl
import hashlib
import io
import json
import os
import platform
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from bench_cli.core.errors import UserError, warn_once
from bench_cli.core.files import unwritable_folder, write_atomically
from bench_cli.results import code_identity
from bench_cli.results.schema import COLUMNS, IDENTITY as _IDENTITY, identity  # the schema names the columns

# Config parts that do not change a result: where things are written and how progress is shown.
NON_SEMANTIC = ("paths", "results", "logger", "hydra", "report", "tuning")
# Dotted keys inside the semantic groups that never change a result either: how a run shows
# progress, its evaluation batch and threads, and task.generator (which generated ListOps the run
# expects: a check of the data, refused when they differ; the record describes the data it read).
NON_SEMANTIC_KEYS = ("trainer.progress", "trainer.eval_batch_size", "trainer.num_threads", "task.generator",
                     "trainer.checkpoint", "trainer.resume")  # where and how often a fit is saved: same result


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
    "measure.head_diversity": False,
    "measure.cache": True,
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
    """The parts of a config that change a result. ``cfg``: a DictConfig, or the plain data
    ``OmegaConf.to_container(cfg, resolve=True)`` gave (copied, not changed: the same keys)."""
    import copy

    c = OmegaConf.to_container(cfg, resolve=True) if isinstance(cfg, DictConfig) else copy.deepcopy(cfg)
    for dotted, renamed in RENAMED_VALUES.items():
        node, leaf = _holder(c, dotted)
        if node is not None and isinstance(node.get(leaf), str) and node[leaf] in renamed:
            node[leaf] = renamed[node[leaf]]
    for k in NON_SEMANTIC:
        c.pop(k, None)
    for dotted in NON_SEMANTIC_KEYS:
        node, leaf = _holder(c, dotted)
        if node is not None:
            node.pop(leaf, None)
    for dotted, neutral in ADDED_KEYS.items():
        node, leaf = _holder(c, dotted)
        if node is not None and leaf in node and node[leaf] == neutral:
            del node[leaf]
    return c


def _digest(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]


def run_keys(cfg) -> tuple[str, str, str]:
    """(config hash, job key, variant key) of a config from one ``semantic_config`` (resolving a
    config is most of the cost: a run resolves it once, issue 21).

    - config hash: the resolved config that determines the result (seed included);
    - job key: a sweep job's key for resume, the semantic config (with seed) minus measurement switches;
    - variant key: the job key without the seed (the runs a report aggregates over seeds share it)."""
    c = semantic_config(cfg)
    config = _digest(c)
    job = _digest(_without_measurement(c))
    c.pop("seed", None)
    return config, job, _digest(c)


def _without_measurement(semantic: dict) -> dict:
    semantic.pop("measure", None)
    return semantic


def config_hash(cfg) -> str:
    return _digest(semantic_config(cfg))


def job_key(cfg) -> str:
    return _digest(_without_measurement(semantic_config(cfg)))


def variant_key(cfg) -> str:
    return run_keys(cfg)[2]


PROJECT_ROOT = Path(__file__).resolve().parents[2]


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
    write_atomically(Path(run_dir) / "run.json", json.dumps(marker, indent=1) + "\n")


@dataclass
class RunFolder:
    """A started run: its folder, its record so far (the identity columns; status failed until it
    ends) and its config resolved once (``config.yaml``, the keys and the loggers read it)."""

    path: Path
    row: dict
    resolved: dict


def start_run(cfg: DictConfig, run_dir: Path | None, run_id: str | None, overrides, write: bool,
              columns: dict | None = None) -> RunFolder:
    """The run folder (``paths.output_dir``/runs/<run id> unless given) with, when ``write`` (rank 0),
    ``config.yaml`` and ``run.json``; the record's identity columns (``overrides``: the run's
    command-line overrides, None: this process's), with ``columns`` (what the caller knows of the
    run that its config does not say)."""
    from datetime import datetime, timezone

    run_id = run_id or new_run_id()
    path = Path(run_dir or Path(cfg.paths.output_dir) / "runs" / run_id)
    path.mkdir(parents=True, exist_ok=True)
    # resolved once (most of the config's cost): config.yaml, the record's keys and the logger read it
    resolved = OmegaConf.to_container(cfg, resolve=True)
    if write:
        save_resolved(resolved, path / "config.yaml")
    row = identity(cfg, run_id=run_id, time=datetime.now(timezone.utc).isoformat(timespec="seconds"),
                   config_path=path / "config.yaml", output_dir=path,
                   overrides=" ".join(overrides) if overrides is not None else command_line(),
                   keys=run_keys(resolved), command=invocation(),
                   provenance={**provenance(), **code_identity.columns(cfg)})
    row.update(columns or {})
    if write:
        write_run_marker(path, row)
    return RunFolder(path, row, resolved)


def save_resolved(resolved: dict, path: Path) -> None:
    """``OmegaConf.save(cfg, path, resolve=True)`` of the config ``resolved`` was resolved from: the
    same text (omegaconf.py ``to_yaml``: its YAML dumper and options), without resolving it again."""
    import yaml

    from bench_cli.config.omegaconf_private import yaml_dumper

    write_atomically(path, yaml.dump(resolved, default_flow_style=False, allow_unicode=True, sort_keys=False,
                                     Dumper=yaml_dumper()), encoding="utf-8")


def write_record(run_dir: Path, results_path, row: dict) -> None:
    """A finished run's record: ``record.json`` in its folder first, then appended to ``results_path``.
    When that append fails (full disk, read-only filesystem) the record is safe in the folder, and
    ``row["_append_error"]`` says so and where."""
    from bench_cli.core import jsontext

    write_atomically(Path(run_dir) / "record.json", jsontext.dumps(row, indent=1, default=str))  # NaN as 'nan'
    try:
        append_record(results_path, row)
    except (OSError, RecordsFileError) as e:
        reason = e.strerror if isinstance(e, OSError) and e.strerror else e
        row["_append_error"] = (f"could not append to {results_path} ({reason}); "
                                f"the record is in {Path(run_dir) / 'record.json'}")


def run_state(run_dir: Path) -> dict | None:
    """The state of a run folder: its record (finished, with status) or its marker with status
    'running' (the process is alive on this host) or 'killed' (started, never finished)."""
    run_dir = Path(run_dir)
    record, marker = run_dir / "record.json", run_dir / "run.json"
    damaged = {"run_id": run_dir.name, "status": "damaged", "folder": str(run_dir)}
    if record.exists():
        finished = _json_object(record)
        # cut short, garbage, JSON of another structure, a folder: said, never a traceback
        return {**finished, "folder": str(run_dir)} if finished is not None else {**damaged, "damaged": record.name}
    if not marker.exists():
        return None
    state = _json_object(marker)
    if state is None:
        return {**damaged, "damaged": marker.name}
    alive = False
    if state.get("host") == __import__("socket").gethostname():
        try:
            os.kill(int(state.get("pid", -1)), 0)
            alive = True
        except (OSError, ValueError):
            alive = False
    return {**state, "status": "running" if alive else "killed", "folder": str(run_dir)}


def _json_object(path: Path) -> dict | None:
    """``path``'s JSON object; None when it is not one (damaged, another structure, unreadable)."""
    try:
        value = json.loads(path.read_text())
    except (ValueError, OSError):
        return None
    return value if isinstance(value, dict) else None


def run_folders(output_dir: Path) -> list[Path]:
    """Run folders under ``output_dir`` (runs/<date>/<id>/ and multirun/<date>/<id>/<job>/)."""
    root = Path(output_dir)
    found = [p.parent for p in root.glob("runs/*/*/config.yaml")] + [p.parent for p in root.glob("multirun/*/*/*/config.yaml")]
    return sorted(set(found), key=lambda p: p.stat().st_mtime)


def target(path: str | Path) -> Path:
    """The file the records of ``path`` go to: a symbolic link is written through (its target
    gets the rows, the link stays a link)."""
    path = Path(path)
    return path.resolve() if path.is_symlink() else path


def check_results_path(path: str | Path) -> None:
    """Before a run: ``path`` can take records -- its folder exists or can be made and is writable,
    and an existing file is an attnbench record file (its header starts with the record columns)
    that reads strictly and takes appends (:func:`check_appendable`)."""
    path = target(path)
    probe = unwritable_folder(path.parent)
    if probe is not None:
        raise UserError(f"results.path={path}: cannot write in {probe} (read-only or not a folder); "
                        f"choose another results.path=FILE")
    if path.exists():
        if not path.is_file():
            raise UserError(f"results.path={path} is not a file")
        with open(path, newline="", errors="replace", encoding="utf-8-sig") as f:  # a BOM is read as `report` reads it
            first = f.readline().strip()
        header = first.split(",")
        if first and header[: len(_IDENTITY)] != list(_IDENTITY):
            raise UserError(f"results.path={path} is not an attnbench record file (its first line is not a record "
                            f"header); choose another results.path=FILE")
        if not os.access(path, os.W_OK):
            raise UserError(f"results.path={path} is read-only; choose another results.path=FILE")
        check_appendable(path, read_table(path))


def check_appendable(path: Path, table: Table | None) -> None:
    """Refuse to append to a file with rows wider than its header (a newer version's): the
    rewrite could only drop their extra fields or give them names it cannot know."""
    wide = table.wide_rows() if table else []
    if wide:
        raise RecordsFileError(f"{path} line {wide[0]}: the row has more fields than the header (written by another "
                               f"version of attnbench?); nothing is appended to this file, so as not to reshape that "
                               f"row: choose another results.path=FILE, or move such rows to a file of their own")


class RecordsFileError(UserError):
    """A records file that cannot be read, or appended to, as it is (one line naming the file and line)."""


@dataclass
class Table:
    """A CSV file as it is: its header, each row's fields as written (an incomplete row is shorter
    than the header, a newer version's row longer) and the file line each row starts on."""
    header: list[str]
    rows: list[list[str]] = field(default_factory=list)
    lines: list[int] = field(default_factory=list)
    bom: bool = False  # the file starts with a UTF-8 byte order mark (a spreadsheet's export): kept

    def wide_rows(self) -> list[int]:
        """Lines of the rows with more fields than the header."""
        return [line for line, r in zip(self.lines, self.rows) if len(r) > len(self.header)]


def read_table(path: str | Path) -> Table | None:
    """The CSV at ``path`` read strictly (None: no file or an empty one), for every reader of
    records (report, sweep resume, the writer itself).

    A row whose quote is never closed, or that runs over several lines with the wrong number of
    fields, is a corrupt file: a RecordsFileError names the file and the line, since reading on
    would silently absorb the rows after it. A row with fewer fields than the header (a line
    another tool left half-written) is kept as it is, with one warning naming its line; a row
    with more fields (a newer version's) is kept too (:func:`read_records` warns, writers refuse)."""
    path = Path(path)
    if not path.is_file():
        return None
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise RecordsFileError(f"{path} is not a text CSV file ({e.reason} at byte {e.start})") from None
    bom = text.startswith(BOM)
    lines = list(io.StringIO(text[len(BOM):] if bom else text, newline=""))  # the physical lines, endings kept
    reader = csv.reader(lines, strict=True)
    table = None
    while True:
        start = reader.line_num + 1
        try:
            fields = next(reader)
        except StopIteration:
            break
        except csv.Error as e:
            if start != len(lines) or "unexpected end of data" not in str(e):
                raise _corrupt(path, start, reader.line_num, str(e)) from None
            fields = next(csv.reader(lines[start - 1:]))  # the last line, cut inside a quoted field
        if not fields:  # a blank line
            continue
        if table is None:
            table = Table(fields, bom=bom)
            continue
        n, width = len(fields), len(table.header)
        if reader.line_num > start and n != width:
            raise _corrupt(path, start, reader.line_num, f"{n} fields where the header has {width}")
        if n < width:
            # once per file, line and process: readers of one file (plan, resume, report) share it
            warn_once(f"warning: {path} line {start}: incomplete row ({n} of {width} fields; a half-written "
                      "line?): kept as it is, its missing fields read as blank")
        table.rows.append(fields)
        table.lines.append(start)
    return table


def _corrupt(path: Path, start: int, end: int, problem: str) -> RecordsFileError:
    where = f"line {start}" if end <= start else f"line {start} (a row running on to line {end})"
    return RecordsFileError(f"{path} {where}: corrupt CSV, {problem} (an unterminated quote?); the file is left "
                            f"as it is: fix or remove that row")


def read_records(path: str | Path) -> list[dict]:
    """The rows of the records file at ``path`` (none when it does not exist), read strictly
    (:func:`read_table`): a field an incomplete row lacks is None, fields beyond the header are left
    out, with one warning (no name can be known for them)."""
    table = read_table(path)
    if table is None:
        return []
    for line in table.wide_rows():
        warn_once(f"warning: {Path(path)} line {line}: the row has more fields than the header (written by another "
                  "version?): the fields beyond the header have no column name and are not read")
    return [{k: (unescape_cell(r[i]) if i < len(r) else None) for i, k in enumerate(table.header)} for r in table.rows]


def read_job_records(path: str | Path) -> tuple[list[dict], list[str]]:
    """(rows, duplicate job keys): the records of ``path`` with each job counted once
    (:func:`one_row_per_job`)."""
    return one_row_per_job(read_records(path))


def one_row_per_job(rows: list[dict]) -> tuple[list[dict], list[str]]:
    """(rows, duplicate job keys). Of the ``ok`` rows that share a ``job_key`` (one job run twice:
    two sweeps of one file at once, a ``--force`` rerun) only the latest stays, so no seed counts
    twice; rows that are not ``ok`` all stay. The duplicate keys are those that had more than one
    ``ok`` row, in the order they first appear."""
    ok_rows: dict[str, list[int]] = {}
    for i, r in enumerate(rows):
        if r.get("status") == "ok" and r.get("job_key"):
            ok_rows.setdefault(r["job_key"], []).append(i)
    dropped = {i for kept in ok_rows.values() for i in kept[:-1]}
    return [r for i, r in enumerate(rows) if i not in dropped], [k for k, idx in ok_rows.items() if len(idx) > 1]


def write_rows(path: str | Path, rows: list[dict], columns: list[str] = COLUMNS, *, append: bool = True) -> None:
    """Write ``rows`` to the CSV at ``path``, after its rows (``append``) or instead of them.

    The one CSV writer (run records, profile points). Under the lock, the whole file is written to a
    temporary file in the same directory and renamed over the original, so a crash mid-write or a
    parallel writer cannot corrupt earlier rows. The header is the file's own (when appending),
    then ``columns`` it lacks, then every other key in the order it first appears: unknown keys
    become new columns at the end and older rows get blanks; existing columns never move. Earlier
    rows are written back field for field (an incomplete row stays incomplete); a file that does
    not read strictly, or has rows wider than its header, is refused (:func:`read_table`,
    :func:`check_appendable`). A symbolic link is written through: its target gets the rows and
    the link stays a link.
    """
    path = target(path)
    with _locked(path):
        old = read_table(path) if append else None
        check_appendable(path, old)
        header = list(old.header) if old else []
        header += [c for c in columns if c not in header]
        for r in rows:
            header += [k for k in r if k not in header]
        buf = io.StringIO(BOM if old and old.bom else "")
        buf.seek(0, io.SEEK_END)
        writer = csv.writer(buf, lineterminator="\n")
        writer.writerow(header)
        for fields in old.rows if old else []:  # complete rows get blanks for new columns, others stay as they are
            writer.writerow(fields + [""] * (len(header) - len(fields)) if len(fields) == len(old.header) else fields)
        for r in rows:
            writer.writerow([escape_cell(_cell(r.get(k))) for k in header])
        write_atomically(path, buf.getvalue())


def append_record(path: str | Path, row: dict) -> None:
    """Append one run record (``COLUMNS`` first)."""
    write_rows(path, [row])


# --- claims: which process runs which job of a records file ------------------------------------
# Two sweeps of one records file plan the same jobs; each job is claimed under the file's lock
# before it runs, in ``<file>.claims`` (JSON: job_key -> the claiming process), and released
# when its record is written. A claim whose process is gone (kill -9) is taken over: on this host
# the process is looked up; a claim from another host lives while its heartbeat (refreshed every
# HEARTBEAT_S by the running job: ``heartbeat``) is younger than the time-to-live
# (``results.claim_ttl_s``, CLAIM_TTL_S by default: a dead node or an OOM-killed job anywhere frees
# its jobs after that long).
HEARTBEAT_S = 30.0
CLAIM_TTL_S = 600.0


def claim_ttl(cfg) -> float:
    """The time-to-live of a claim from another host, in seconds (``results.claim_ttl_s``)."""
    ttl = OmegaConf.select(cfg, "results.claim_ttl_s", default=None)
    return CLAIM_TTL_S if ttl is None else float(ttl)
def _claims_path(path: Path) -> Path:
    return path.with_name(path.name + ".claims")


def _read_claims(path: Path) -> dict:
    try:
        claims = json.loads(_claims_path(path).read_text())
    except (OSError, ValueError):  # none yet, or a torn file: no process can be shown to hold a claim
        return {}
    return claims if isinstance(claims, dict) else {}


def _write_claims(path: Path, claims: dict) -> None:
    if claims:
        write_atomically(_claims_path(path), json.dumps(claims, indent=1, sort_keys=True) + "\n")
    else:
        _claims_path(path).unlink(missing_ok=True)


def _process_start(pid: int) -> str | None:
    """The start time of process ``pid`` in clock ticks since boot (/proc/PID/stat field 22): with
    the pid it names one process, even after the pid is reused."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _this_process() -> dict:
    import socket
    from datetime import datetime, timezone

    now = datetime.now(timezone.utc).isoformat(timespec="seconds")
    me = {"pid": os.getpid(), "host": socket.gethostname(), "process_start": _process_start(os.getpid()),
          "since": now, "heartbeat": now}
    if os.environ.get("SLURM_JOB_ID"):  # a requeued Slurm job keeps its id: its earlier claim is its own
        me["slurm_job"] = os.environ["SLURM_JOB_ID"]
    return me


def heartbeat_age(claim: dict) -> float | None:
    """Seconds since the claim's last heartbeat (its ``since`` for a claim written before
    heartbeats); None when it has neither."""
    from datetime import datetime, timezone

    try:
        beat = datetime.fromisoformat(str(claim.get("heartbeat") or claim["since"]))
    except (KeyError, ValueError):
        return None
    if beat.tzinfo is None:
        beat = beat.replace(tzinfo=timezone.utc)
    return (datetime.now(timezone.utc) - beat).total_seconds()


def claim_alive(claim: dict, ttl_s: float = CLAIM_TTL_S) -> bool:
    """Whether the process that holds ``claim`` still runs: on this host, that process exists;
    on another host, its heartbeat is younger than ``ttl_s``."""
    import socket

    if claim.get("host") != socket.gethostname():
        age = heartbeat_age(claim)
        return age is not None and age < ttl_s
    try:
        pid = int(claim["pid"])
        os.kill(pid, 0)
    except (KeyError, TypeError, ValueError, ProcessLookupError):
        return False
    except PermissionError:  # another user's process
        return True
    started = claim.get("process_start")
    return started is None or _process_start(pid) == started


def _holder_text(claim: dict) -> str:
    import socket

    if claim.get("host") == socket.gethostname():
        return f"running in pid {claim.get('pid')} since {claim.get('since', '?')}"
    return (f"running in pid {claim.get('pid')} on {claim.get('host')} since {claim.get('since', '?')} "
            f"(heartbeat {duration_text(heartbeat_age(claim))} ago)")


def duration_text(seconds: float | None) -> str:
    """45 s, 12 min, 3.5 h (a claim's age, a sweep's time left)."""
    if seconds is None:
        return "?"
    if seconds >= 7200:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min"


def claim_state(claim: dict, ttl_s: float = CLAIM_TTL_S) -> str:
    """What a dry run says of a claimed job: running (where, heartbeat age) or stale."""
    if claim_alive(claim, ttl_s):
        return _holder_text(claim)
    return f"stale claim of pid {claim.get('pid')} on {claim.get('host')} ({_dead_reason(claim, ttl_s)}): taken over by the next sweep"


def _dead_reason(claim: dict, ttl_s: float) -> str:
    import socket

    if claim.get("host") == socket.gethostname():
        return "no longer running"
    return (f"last heartbeat {claim.get('heartbeat') or claim.get('since', '?')}, "
            f"{duration_text(heartbeat_age(claim))} ago, over the {duration_text(ttl_s)} time-to-live")


def claim_job(path: str | Path, key: str, ok_rows_from: int = 0, ttl_s: float = CLAIM_TTL_S) -> tuple[bool, str]:
    """Claim job ``key`` of the records file ``path`` for this process, under the file's lock:
    (True, note) when this process may run it (note says whose dead claim it took over, or is
    empty); (False, why) when the file holds an ``ok`` row of it (from row ``ok_rows_from`` on:
    ``--force`` reruns the rows it planned to rerun) or a live process holds its claim."""
    path = target(path)
    with _locked(path):
        table = read_table(path)
        for r in table.rows[ok_rows_from:] if table else []:
            row = dict(zip(table.header, r))
            if row.get("status") == "ok" and row.get("job_key") == key and not code_identity.changed_plugins(row):
                return False, f"done by another process (ok record {row.get('run_id')})"
        claims = _read_claims(path)
        me, note = _this_process(), ""
        held = claims.get(key)
        if held and (held.get("pid"), held.get("host")) != (me["pid"], me["host"]):
            where = "" if held.get("host") == me["host"] else f" on {held.get('host')}"
            requeued = held.get("slurm_job") is not None and held.get("slurm_job") == me.get("slurm_job")
            if not requeued and claim_alive(held, ttl_s):
                return False, _holder_text(held)
            note = (f"taking over the claim of pid {held.get('pid')}{where} (since {held.get('since', '?')}), "
                    + (f"the same Slurm job {me['slurm_job']}, requeued" if requeued else _dead_reason(held, ttl_s)))
        claims[key] = me
        _write_claims(path, claims)
    return True, note


def release_job(path: str | Path, key: str) -> None:
    """Drop this process's claim of job ``key`` (its record is written, or it never ran)."""
    path = target(path)
    with _locked(path):
        claims = _read_claims(path)
        held, me = claims.get(key) or {}, _this_process()
        if (held.get("pid"), held.get("host")) == (me["pid"], me["host"]):
            del claims[key]
            _write_claims(path, claims)


def refresh_claim(path: str | Path, key: str) -> None:
    """This process's claim of job ``key``: its heartbeat set to now (a claim another process
    took over is left alone)."""
    path = target(path)
    with _locked(path):
        claims, me = _read_claims(path), _this_process()
        held = claims.get(key) or {}
        if (held.get("pid"), held.get("host")) == (me["pid"], me["host"]):
            held["heartbeat"] = me["heartbeat"]
            _write_claims(path, claims)


@contextmanager
def heartbeat(path: str | Path, key: str, every_s: float = HEARTBEAT_S):
    """While it holds, a background thread refreshes this process's claim of ``key`` every
    ``every_s`` seconds, however long an epoch takes."""
    import threading

    stop = threading.Event()

    def beat():
        while not stop.wait(every_s):
            try:
                refresh_claim(path, key)
            except (OSError, UserError):  # a full disk, a records file gone: the next beat tries again
                pass

    thread = threading.Thread(target=beat, name="attnbench-claim-heartbeat", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=10)


def claimed_jobs(path: str | Path, keys, ttl_s: float = CLAIM_TTL_S) -> dict[str, str]:
    """job_key -> what its claim says (running where, or stale), for the ``keys`` claimed by
    another process (a dry run's status column)."""
    path = target(path)
    claims, me = _read_claims(path), _this_process()
    return {k: claim_state(c, ttl_s) for k in keys if (c := claims.get(k))
            and (c.get("pid"), c.get("host")) != (me["pid"], me["host"])}


def running_elsewhere(path: str | Path, keys, ttl_s: float = CLAIM_TTL_S) -> dict[str, str]:
    """job_key -> who runs it, for the ``keys`` that another live process has claimed."""
    me = _this_process()
    return {k: _holder_text(c) for k, c in live_claims(path, keys, ttl_s).items()
            if (c.get("pid"), c.get("host")) != (me["pid"], me["host"])}


def live_claims(path: str | Path, keys, ttl_s: float = CLAIM_TTL_S) -> dict[str, dict]:
    """job_key -> its claim, for the ``keys`` a live process (this one included) has claimed: the
    jobs of the file running now."""
    claims = _read_claims(target(path))
    return {k: c for k in keys if (c := claims.get(k)) and claim_alive(c, ttl_s)}


BOM = "\ufeff"
# A spreadsheet runs a cell that starts with one of these as a formula (CSV injection)
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def escape_cell(text: str) -> str:
    """``text`` as a CSV cell a spreadsheet shows as text: a leading apostrophe before a cell that
    would start a formula (``=1+2`` -> ``'=1+2``), and before one that starts with an apostrophe
    already, so that :func:`unescape_cell` gives back the original; numbers (-0.5, -inf) stay
    numbers. Every writer of records and reports (``write_rows``) escapes; ``read_records``
    unescapes. A carriage return inside a cell becomes a line feed: the csv module quotes a cell
    for its line terminator (LF) only, and a bare CR ends the line for every reader, splitting the row."""
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    if text.startswith("'") or (text.startswith(FORMULA_STARTS) and not (text[0] in "+-" and _is_number(text))):
        return "'" + text
    return text


def unescape_cell(text: str) -> str:
    return text[1:] if text.startswith("'") else text


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


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
