"""What a sweep prints about its jobs as a whole: the dry run's table (every job, done, claimed,
its data here or not), the note on the jobs this machine could not run, and the summary after the
sweep (each job's outcome, the table of those that did not finish ok, their checkpoints, the
command that uploads their offline wandb runs).
"""
from __future__ import annotations

from pathlib import Path

from bench_cli.commands.sweep import resume
from bench_cli.commands.sweep.plan import Job
from bench_cli.results.job_records import latest_ok_per_job
from bench_cli.results import claims, csv_store


def print_plan(jobs: list[Job], done: dict, force: bool, missing: dict[str, str], claimed: dict[str, str],
               stale: dict[str, str]) -> None:
    """The dry run's table: every job, whether it is done or claimed by another process (``claimed``:
    job_key -> running where, or a stale claim), and whether its data is here (``missing``: job_key
    -> what is missing); then each missing dataset once, with how to get it."""
    from rich.markup import escape
    from rich.table import Table

    from bench_cli.core.ui import console, wide

    t = Table(title="jobs")
    for col in ("#", "job", "job_key", "status"):
        t.add_column(col)
    for i, j in enumerate(jobs, 1):
        status = ("[yellow]rerun[/]" if force else "[dim]done, skip[/]") if j.key in done else "to run"
        status += resume.resume_note(j) if force or j.key not in done else ""
        if j.key in stale:  # its ok record was made by a plugin that has changed since (code_identity)
            status = f"to run: {escape(stale[j.key])}"
        if j.key in claimed and (force or j.key not in done):
            status = escape(claimed[j.key])
        if j.key in missing:
            status += ", [red]data missing[/]"
        t.add_row(str(i), j.label, j.key, status)
    wide(console, 120).print(t)
    if missing:
        console.print(f"[red]data missing[/] for {len(missing)} of {len(jobs)} jobs (a sweep refuses to start "
                      "until it is here):", highlight=False)
        for message in dict.fromkeys(missing.values()):
            console.print(f"  {escape(message)}", highlight=False, soft_wrap=True)


def print_lacking(lacking: dict[str, str], n_todo: int) -> None:
    """A note on the jobs to run that ask for what this machine lacks (a GPU): fine where the
    launcher puts them on a machine that has it (a Slurm GPU node); here they would be recorded as failed."""
    from rich.markup import escape

    from bench_cli.core.ui import console

    if lacking:
        console.print(f"[yellow]note[/]: {len(lacking)} of {n_todo} jobs to run ask for what this machine lacks; each "
                      "job checks the machine it runs on, one that lacks it is recorded as failed: "
                      f"{escape(next(iter(lacking.values())))}", highlight=False, soft_wrap=True)


def _print_checkpoints(rows: list[dict]) -> None:
    """Where the checkpoints of the jobs that did not finish are and how big (the same command
    resumes them; bench_cli/engine/checkpoint.py)."""
    from bench_cli.engine.checkpoint import folder_bytes
    from bench_cli.core.ui import console, human

    folders = {Path(r["checkpoint_dir"]) for r in rows if r.get("checkpoint_dir")}
    folders = sorted(f for f in folders if folder_bytes(f))
    if folders:
        roots = ", ".join(sorted({str(f.parent) for f in folders}))
        console.print(f"checkpoints of {len(folders)} unfinished jobs: {human(sum(map(folder_bytes, folders)), 'B')} "
                      f"in {roots} (the same command resumes them)", highlight=False, soft_wrap=True)


RUNNING_ELSEWHERE = "running elsewhere"  # an outcome: another process holds the job's claim


def outcomes(jobs: list[Job], paths, before: dict[str, int], done_before: dict) -> list[tuple[Job, str, dict | None]]:
    """(job, status, record) for every job: the status of its newest record written since the sweep
    started, 'skipped' when it has an ok record from before (or from another process that ran it),
    'running elsewhere' when another live process holds its claim, 'missing' when nothing was recorded."""
    new: dict[str, dict] = {}
    ok: dict[str, dict] = dict(done_before)
    running: dict[str, str] = {}
    for p in paths:
        rows = csv_store.read_records(p)
        for r in rows[before.get(p, 0):]:
            new[r.get("job_key", "")] = r
        ok.update(latest_ok_per_job(rows))
        running.update(claims.running_elsewhere(p, [j.key for j in jobs], claims.claim_ttl(jobs[0].cfg)))
    out = []
    for j in jobs:
        if j.key in new:
            out.append((j, new[j.key].get("status") or "failed", new[j.key]))
        elif j.key in ok:
            out.append((j, "skipped", ok[j.key]))
        elif j.key in running:
            out.append((j, RUNNING_ELSEWHERE, {"error": running[j.key]}))
        else:
            out.append((j, "missing", None))
    return out


def summarize(jobs, paths, before, done_before, seconds: float) -> int:
    """The sweep's last lines: the table of the jobs that did not finish ok, then one line of counts;
    the number of those jobs (``outcomes``' arguments)."""
    from rich.markup import escape
    from rich.table import Table

    from bench_cli.core.ui import console, wide

    res = outcomes(jobs, paths, before, done_before)
    counts: dict[str, int] = {}
    for _, status, _ in res:
        counts[status] = counts.get(status, 0) + 1
    bad = [(j, s, r) for j, s, r in res if s not in ("ok", "skipped", RUNNING_ELSEWHERE)]
    parts = ", ".join(f"{n} {s}" for s, n in sorted(counts.items(), key=lambda kv: (kv[0] != "ok", kv[0])))
    if bad:
        t = Table(title=f"{len(bad)} of {len(jobs)} jobs did not finish ok (rerun the same command to retry them)")
        for col in ("job", "status", "error", "run folder"):
            t.add_column(col, overflow="fold")
        for j, s, r in bad:
            t.add_row(j.label, s, escape((r or {}).get("error") or "no record (not started, killed, or the launcher failed)"),
                      (r or {}).get("output_dir", ""))
        wide(console, 160).print(t)
        _print_checkpoints([r for _, _, r in bad if r])
    for line in resume.resumed_lines(res):
        console.print(escape(line), highlight=False, soft_wrap=True)
    style = "red" if bad else "green"
    console.print(f"[{style}]sweep done[/] in {seconds:.0f} s: {len(jobs)} jobs: {parts}", soft_wrap=True)
    _print_offline_runs([r["output_dir"] for _, s, r in res if s != "skipped" and (r or {}).get("output_dir")])
    return len(bad)


def _print_offline_runs(output_dirs: list[str]) -> None:
    """The command that uploads the jobs' offline wandb runs (logger=wandb offline; docs/logging.md)."""
    from bench_cli.results.loggers import offline_sync
    from bench_cli.core.ui import print_path

    found = offline_sync(output_dirs)
    if found:
        print_path(f"wandb offline runs ({found[0]}), upload them with", found[1])
