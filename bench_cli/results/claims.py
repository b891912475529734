"""Job claims: which process runs which job of a records file.

Two sweeps of one records file plan the same jobs, and two `attnbench run` of one config would
train into one checkpoint folder; so each job is claimed under the file's lock
(:func:`bench_cli.results.csv_store.locked`) before it runs, in ``<file>.claims`` (JSON: job_key ->
the claiming process), and released when its record is written. A claim whose process is gone
(kill -9) is taken over: on this host the process is looked up
(:func:`bench_cli.core.processes.process_alive`); a claim from another host lives while its
heartbeat (refreshed every HEARTBEAT_S by the running job: :func:`heartbeat`) is younger than the
time-to-live (``results.claim_ttl_s``, CLAIM_TTL_S by default: a dead node or an OOM-killed job
anywhere frees its jobs after that long).

A heartbeat is another host's clock reading: it is trusted only within the time-to-live on either
side of this host's clock. A heartbeat further ahead than that (a clock set wrong, a claim file
edited by hand) would otherwise keep its job claimed for ever; it is taken for stale, and the line
that says so names the skew.
"""
from __future__ import annotations

import json
import os
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path

from omegaconf import OmegaConf

from bench_cli.core.errors import UserError
from bench_cli.core.files import write_atomically
from bench_cli.core.processes import process_alive, process_start, this_host
from bench_cli.core.ui import duration_text
from bench_cli.results import code_identity
from bench_cli.results.csv_store import locked, read_table, target
from bench_cli.results.job_records import latest_ok_per_job

HEARTBEAT_S = 30.0
CLAIM_TTL_S = 600.0


def claim_ttl(cfg) -> float:
    """The time-to-live of a claim from another host, in seconds (``results.claim_ttl_s``)."""
    ttl = OmegaConf.select(cfg, "results.claim_ttl_s", default=None)
    return CLAIM_TTL_S if ttl is None else float(ttl)


def _claims_path(path: Path) -> Path:
    return path.with_name(path.name + ".claims")


def _read_claims(path: Path) -> dict[str, dict]:
    try:
        claims = json.loads(_claims_path(path).read_text())
    except (OSError, ValueError):  # none yet, or a torn file: no process can be shown to hold a claim
        return {}
    # JSON of another shape names no process either
    return {k: c for k, c in claims.items() if isinstance(c, dict)} if isinstance(claims, dict) else {}


def _write_claims(path: Path, claims: dict) -> None:
    if claims:
        write_atomically(_claims_path(path), json.dumps(claims, indent=1, sort_keys=True) + "\n")
    else:
        _claims_path(path).unlink(missing_ok=True)


def _this_process() -> dict:
    now = datetime.now(timezone.utc).isoformat(timespec="seconds")
    me = {"pid": os.getpid(), "host": this_host(), "process_start": process_start(),
          "since": now, "heartbeat": now}
    if os.environ.get("SLURM_JOB_ID"):  # a requeued Slurm job keeps its id: its earlier claim is its own
        me["slurm_job"] = os.environ["SLURM_JOB_ID"]
    return me


def _is_mine(claim: dict, me: dict) -> bool:
    return (claim.get("pid"), claim.get("host")) == (me["pid"], me["host"])


def heartbeat_age(claim: dict) -> float | None:
    """Seconds since the claim's last heartbeat (its ``since`` for a claim written before
    heartbeats), by this host's clock: negative when the heartbeat is ahead of it (the claiming
    host's clock is ahead); None when it has neither."""
    try:
        beat = datetime.fromisoformat(str(claim.get("heartbeat") or claim["since"]))
    except (KeyError, ValueError):
        return None
    if beat.tzinfo is None:
        beat = beat.replace(tzinfo=timezone.utc)
    return (datetime.now(timezone.utc) - beat).total_seconds()


def claim_alive(claim: dict, ttl_s: float = CLAIM_TTL_S) -> bool:
    """Whether the process that holds ``claim`` still runs: on this host, that process exists;
    on another host, its heartbeat is younger than ``ttl_s`` and not more than ``ttl_s`` ahead of
    this host's clock (beyond that the other clock is not trusted: a dead claim frees its job at
    most ``2 * ttl_s`` after its last heartbeat, whatever that clock said)."""
    if claim.get("host") != this_host():
        age = heartbeat_age(claim)
        return age is not None and -ttl_s <= age < ttl_s
    return process_alive(claim.get("pid"), claim.get("process_start"))


def _holder_text(claim: dict) -> str:
    if claim.get("host") == this_host():
        return f"running in pid {claim.get('pid')} since {claim.get('since', '?')}"
    return (f"running in pid {claim.get('pid')} on {claim.get('host')} since {claim.get('since', '?')} "
            f"(heartbeat {_heartbeat_text(heartbeat_age(claim))})")


def _heartbeat_text(age: float | None) -> str:
    """How long ago a heartbeat was, or how far ahead of this host's clock it is."""
    if age is not None and age < 0:
        return f"{duration_text(-age)} ahead of this host's clock"
    return f"{duration_text(age)} ago"


def claim_state(claim: dict, ttl_s: float = CLAIM_TTL_S) -> str:
    """What a dry run says of a claimed job: running (where, heartbeat age) or stale."""
    if claim_alive(claim, ttl_s):
        return _holder_text(claim)
    return f"stale claim of pid {claim.get('pid')} on {claim.get('host')} ({_dead_reason(claim, ttl_s)}): taken over by the next sweep"


def _dead_reason(claim: dict, ttl_s: float) -> str:
    if claim.get("host") == this_host():
        return "no longer running"
    age = heartbeat_age(claim)
    beat = claim.get("heartbeat") or claim.get("since", "?")
    if age is not None and age < 0:
        return (f"last heartbeat {beat}, {duration_text(-age)} ahead of this host's clock: a clock skew over the "
                f"{duration_text(ttl_s)} time-to-live, not trusted")
    return f"last heartbeat {beat}, {_heartbeat_text(age)}, over the {duration_text(ttl_s)} time-to-live"


def claim_job(path: str | Path, key: str, ok_rows_from: int | None = 0,
              ttl_s: float = CLAIM_TTL_S) -> tuple[bool, str]:
    """Claim job ``key`` of the records file ``path`` for this process, under the file's lock:
    (True, note) when this process may run it (note says whose dead claim it took over, or is
    empty); (False, why) when the file holds an ``ok`` row of it from row ``ok_rows_from`` on
    (``--force`` reruns the rows it planned to rerun; None: ok rows do not matter, `attnbench run`
    runs a job again) or a live process holds its claim."""
    path = target(path)
    with locked(path):
        table = read_table(path) if ok_rows_from is not None else None
        done = latest_ok_per_job(table.records(ok_rows_from)).get(key) if table else None
        if done is not None and not code_identity.changed_plugins(done):  # a changed plugin's record: run again
            return False, f"done by another process (ok record {done.get('run_id')})"
        claims = _read_claims(path)
        me, note = _this_process(), ""
        held = claims.get(key)
        if held and not _is_mine(held, me):
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
    with locked(path):
        claims = _read_claims(path)
        held, me = claims.get(key) or {}, _this_process()
        if _is_mine(held, me):
            del claims[key]
            _write_claims(path, claims)


def refresh_claim(path: str | Path, key: str) -> None:
    """This process's claim of job ``key``: its heartbeat set to now (a claim another process
    took over is left alone)."""
    path = target(path)
    with locked(path):
        claims, me = _read_claims(path), _this_process()
        held = claims.get(key) or {}
        if _is_mine(held, me):
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
    return {k: claim_state(c, ttl_s) for k in keys if (c := claims.get(k)) and not _is_mine(c, me)}


def running_elsewhere(path: str | Path, keys, ttl_s: float = CLAIM_TTL_S) -> dict[str, str]:
    """job_key -> who runs it, for the ``keys`` that another live process has claimed."""
    me = _this_process()
    return {k: _holder_text(c) for k, c in live_claims(path, keys, ttl_s).items() if not _is_mine(c, me)}


def live_claims(path: str | Path, keys, ttl_s: float = CLAIM_TTL_S) -> dict[str, dict]:
    """job_key -> its claim, for the ``keys`` a live process (this one included) has claimed: the
    jobs of the file running now."""
    claims = _read_claims(target(path))
    return {k: c for k in keys if (c := claims.get(k)) and claim_alive(c, ttl_s)}
