"""What every report's header shares (the records file, the wall clock, the command that reruns it,
the metric's direction): below the report commands, so that ``command``, ``grouped`` and ``zoo``
import it and nothing imports back."""
from __future__ import annotations

import os
import shlex
from pathlib import Path


def rerun_command(name: str | None, path: Path | None, out_dir: Path, opts: dict, overrides: list[str]) -> str:
    """The command that rewrites the report just written: its records file (None: the ones the
    command finds itself) and output folder spelled out (their defaults depend on the config), then
    every other option and override given."""
    committed = ["--committed", str(opts["committed"])] if opts.get("committed") else []
    words = ["attnbench", "report", *([name] if name else []), *(["--records", str(path)] if path else []),
             *committed, "--out", str(out_dir),
             *(["--format", opts["format"]] if opts.get("format") else []),
             *(["--all"] if opts["all"] else []), *(["--width", str(opts["width"])] if opts["width"] else []),
             *overrides]
    return " ".join(shlex.quote(w) for w in words)


def wall_clock(rows: list[dict]) -> str | None:
    """What the sweep cost on the machine that ran it: the time during which at least one run was in
    progress (the union of the runs' intervals, so a sweep resumed hours later is not charged for the
    pause), the sittings it took, and the summed run times (which count parallel runs twice)."""
    from datetime import datetime, timedelta

    spans = []
    for r in rows:
        try:
            start = datetime.fromisoformat(str(r.get("time")))
            spans.append((start, start + timedelta(seconds=float(r.get("wall_time_s") or 0))))
        except (TypeError, ValueError):
            continue
    if not spans:
        return None
    merged: list[list] = []                  # the intervals with at least one run in progress
    for s, e in sorted(spans):
        if merged and s <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], e)
        else:
            merged.append([s, e])
    busy = sum((e - s).total_seconds() for s, e in merged)
    sittings = 1 + sum((b[0] - a[1]).total_seconds() > SITTING_GAP_S for a, b in zip(merged, merged[1:]))
    total = sum((e - s).total_seconds() for s, e in spans)
    span = (max(e for _, e in spans) - min(s for s, _ in spans)).total_seconds()
    where = f"{span / 60:.1f} min from the first run's start to the last run's end"
    if sittings > 1:
        where += f", in {sittings} sittings"
    return f"{busy / 60:.1f} min with runs in progress ({where}; {total / 60:.1f} min of runs)"


# A pause longer than this between runs (nothing in progress) starts a new sitting: a rerun that
# resumed the sweep. Shorter gaps are the sweep's own planning and start-up.
SITTING_GAP_S = 600


def higher_is_better(rows: list[dict], settings) -> bool | None:
    """The direction of the records' selection metric (or ``report.higher_is_better``), when known."""
    flags = {str(r.get("higher_is_better", "")).lower() for r in rows} - {""}
    higher = settings.get("higher_is_better")
    return flags.pop() == "true" if higher is None and len(flags) == 1 else higher


def direction_note(rows: list[dict], settings) -> str:
    return {True: " (higher is better)", False: " (lower is better)"}.get(higher_is_better(rows, settings), "")


def records_line(path: Path, used: list[dict]) -> str:
    """The records file, with the runs used and the code and torch versions that made them."""
    commits = sorted({(r.get("git_commit", "")[:10] + (" (dirty)" if r.get("git_dirty") == "true" else "")) for r in used})
    return (f"records: {path} ({len(used)} runs; git {', '.join(commits) or '—'}; "
            f"torch {', '.join(sorted({r.get('torch_version', '') for r in used})) or '—'})")


def commands_text(rows: list[dict], fallback: str) -> str:
    """The commands that made the records, each once, in the order they first wrote one (a sweep
    rerun with more seeds, another dataset, other overrides): run as printed they remake the
    records; ``fallback`` only for records that name no command."""
    commands = list(dict.fromkeys(str(r["command"]) for r in rows if r.get("command")))
    return ", then ".join(f"`{c}`" for c in commands) if commands else f"`{fallback}`"


def made_by() -> str:
    """'; made by `make ...`' when a make target ran the report (ATTNBENCH_MADE_BY, mk/reproduce.mk)."""
    return f"; made by `{os.environ['ATTNBENCH_MADE_BY']}`" if os.environ.get("ATTNBENCH_MADE_BY") else ""


def overrides_of(row: dict) -> dict[str, str]:
    """A record's ``overrides`` as {key: value} (``+key``/``~key`` as ``key``)."""
    pairs = (tok.partition("=") for tok in (row.get("overrides") or "").split())
    return {k.lstrip("+~"): v for k, eq, v in pairs if eq}
