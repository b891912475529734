"""A run's folder: ``config.yaml`` and ``run.json`` when it starts, ``record.json`` when it ends
(then the record is appended to the records file), and what a folder says of its run (`attnbench
ls runs`: finished with its status, running, or killed)."""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from bench_cli.core.files import write_atomically
from bench_cli.core.processes import process_alive, this_host
from bench_cli.results import code_identity, csv_store
from bench_cli.results.job_keys import run_keys
from bench_cli.results.provenance import command_line, invocation, provenance
from bench_cli.results.schema import identity


def new_run_id() -> str:
    """A run's id: UTC time and a random suffix (unique for runs started in the same second)."""
    import uuid
    from datetime import datetime, timezone

    return f"{datetime.now(timezone.utc):%Y%m%dT%H%M%S}-{uuid.uuid4().hex[:6]}"


def write_run_marker(run_dir: Path, row: dict) -> None:
    """``run.json`` in a run folder: which process runs it since when (a folder with it and
    without ``record.json`` is a run that was killed or is still going: :func:`run_state`)."""
    marker = {k: row.get(k) for k in ("run_id", "time", "task", "dataset", "model", "seed", "protocol",
                                       "experiment", "job_key")}
    marker.update(pid=os.getpid(), host=this_host())
    write_atomically(Path(run_dir) / "run.json", json.dumps(marker, indent=1) + "\n")


@dataclass
class RunFolder:
    """A started run: its folder, its record so far (the identity columns; status failed until it
    ends) and its config resolved once (``config.yaml``, the keys and the loggers read it)."""

    path: Path
    row: dict
    resolved: dict


def start_run(cfg: DictConfig, run_dir: Path | None, run_id: str | None, overrides, write: bool,
              columns: dict | None = None, resolved: dict | None = None) -> RunFolder:
    """The run folder (``paths.output_dir``/runs/<run id> unless given) with, when ``write`` (rank 0),
    ``config.yaml`` and ``run.json``; the record's identity columns (``overrides``: the run's
    command-line overrides, None: this process's), with ``columns`` (what the caller knows of the
    run that its config does not say; ``resolved``: ``cfg`` resolved, when the caller has it)."""
    from datetime import datetime, timezone

    run_id = run_id or new_run_id()
    path = Path(run_dir or Path(cfg.paths.output_dir) / "runs" / run_id)
    path.mkdir(parents=True, exist_ok=True)
    # resolved once (most of the config's cost): config.yaml, the record's keys and the logger read it
    if resolved is None:
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


def write_record(run_dir: Path, results_path, row: dict) -> str | None:
    """A finished run's record: ``record.json`` in its folder first, then appended to ``results_path``.
    When that append fails (full disk, read-only filesystem) the record is safe in the folder, and
    the returned line says so and where (None: appended)."""
    from bench_cli.core import jsontext

    write_atomically(Path(run_dir) / "record.json", jsontext.dumps(row, indent=1, default=str))  # NaN as 'nan'
    try:
        csv_store.append_record(results_path, row)
    except (OSError, csv_store.RecordsFileError) as e:
        reason = e.strerror if isinstance(e, OSError) and e.strerror else e
        return f"could not append to {results_path} ({reason}); the record is in {Path(run_dir) / 'record.json'}"
    return None


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
    alive = state.get("host") == this_host() and process_alive(state.get("pid"))
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
