"""A sweep's overall progress (bench_cli/commands/sweep/progress.py, docs/progress.md): jobs done /
failed / running / to go and a time left, read from the records and claims the jobs write, shown
as plain lines when redirected and as a live line on a terminal, for every launcher."""
from __future__ import annotations

import io
import os
import re
import time
from types import SimpleNamespace

import pytest

from bench_cli.commands import sweep as sweep_command
from bench_cli.commands.sweep import progress as sweep_progress
from bench_cli.commands.sweep.job import job_line_head, job_printer
from bench_cli.core import ui
from bench_cli.results import claims, csv_store
from test_sweep import sweep, tiny

LINE = re.compile(r"^sweep progress: (\d+) done, (\d+) failed, (\d+) running, (\d+) to go; ETA (\d+ s|\?), \d+ s elapsed$")


def progress_lines(out: str) -> list[tuple[int, int, int, int, str]]:
    return [(int(m[1]), int(m[2]), int(m[3]), int(m[4]), m[5]) for line in out.splitlines() if (m := LINE.match(line))]


def test_counts_come_from_the_records_and_claims_the_jobs_write(workdir, monkeypatch):
    path = str(workdir / "res.csv")
    csv_store.append_record(path, {"run_id": "earlier", "status": "failed", "job_key": "k1"})  # before the sweep
    now = [100.0]
    monkeypatch.setattr(sweep_progress, "time", SimpleNamespace(monotonic=lambda: now[0]))
    progress = sweep_progress.SweepProgress([(k, path) for k in ("k1", "k2", "k3", "k4")], {path: 1}, ttl_s=600)
    assert progress.poll() == sweep_progress.Counts(4)  # the row from before the sweep is not this sweep's outcome
    csv_store.append_record(path, {"run_id": "a", "status": "ok", "job_key": "k1"})
    csv_store.append_record(path, {"run_id": "b", "status": "nan", "job_key": "k2"})
    csv_store.append_record(path, {"run_id": "c", "status": "ok", "job_key": "other"})  # not a job of this sweep
    assert claims.claim_job(path, "k3")[0]
    now[0] = 130.0  # two jobs in 30 s: 15 s a job, two left
    counts = progress.poll()
    assert (counts.done, counts.failed, counts.running, counts.to_go, counts.eta_s) == (1, 1, 1, 1, 30.0)
    assert counts.text(30.0) == "1 done, 1 failed, 1 running, 1 to go; ETA 30 s, 30 s elapsed"
    assert "ETA ?" in sweep_progress.Counts(4).text(5.0)  # nothing finished: no time per job yet
    assert sweep_progress.Counts(200, done=16, failed=1, running=2, eta_s=9000).text(730) == \
        "16 done, 1 failed, 2 running, 181 to go; ETA 2.5 h, 12 min elapsed"


def test_redirected_lines_after_each_finished_job_and_while_quiet(workdir, monkeypatch, capsys):
    monkeypatch.setattr(ui, "console", ui.Console(file=io.StringIO(), force_terminal=False))
    shown = []
    monkeypatch.setattr(ui.console, "print", lambda text, **kw: shown.append(text))
    now = [0.0]
    monkeypatch.setattr(sweep_progress, "time", SimpleNamespace(monotonic=lambda: now[0]))
    progress = sweep_progress.SweepProgress([("k1", "x.csv"), ("k2", "x.csv")], {}, ttl_s=600)
    for now[0], finished in ((1.0, 0), (30.0, 0), (31.0, 1), (32.0, 1), (90.0, 1), (92.0, 1), (93.0, 2)):
        progress._show(sweep_progress.Counts(2, done=finished))
    assert [t.split(";")[0] for t in shown] == ["sweep progress: 1 done, 0 failed, 0 running, 1 to go",
                                                "sweep progress: 1 done, 0 failed, 0 running, 1 to go",
                                                "sweep progress: 2 done, 0 failed, 0 running, 0 to go"]
    assert sweep_progress.QUIET_LINE_S == 60  # the middle line: a minute (92 - 31 s) without a finished job


def test_on_a_terminal_the_progress_is_one_live_line_of_80_columns(workdir, monkeypatch):
    out = io.StringIO()
    monkeypatch.setattr(ui, "console", ui.Console(file=out, force_terminal=True, width=80))
    monkeypatch.setattr(sweep_progress, "POLL_S", 0.05)
    path = str(workdir / "res.csv")
    with sweep_progress.SweepProgress([("k1", path), ("k2", path)], {}, ttl_s=600) as progress:
        csv_store.append_record(path, {"run_id": "a", "status": "ok", "job_key": "k1"})
        for _ in range(100):  # the background thread reads the record within a poll or two
            if progress.bar.tasks[0].completed == 1:
                break
            time.sleep(0.05)
        progress.bar.refresh()
    shown = out.getvalue()
    assert re.search(r"sweep\S* \S* 1 done, 0 failed, 0 running, 1 to go; ETA \d+ s, \d+ s elapsed\s", shown), shown
    assert "sweep progress:" not in shown  # no plain lines on a terminal


def test_a_job_in_a_worker_process_clears_the_sweeps_live_line_in_the_same_write(monkeypatch):
    out = io.StringIO()
    monkeypatch.setattr(ui, "console", ui.Console(file=out, force_terminal=True, width=100))
    plan = sweep_command.JobPlan({}, 1, sweep_pid=os.getpid() + 1, live_line=True)
    job_printer(plan)(f"{job_line_head(0, 1)} [cyan]start[/]   uea/Fixture softmax seed=0")
    assert out.getvalue().startswith("\r\x1b[2K[sweep 1/1] ")
    out.truncate(0), out.seek(0)
    job_printer(sweep_command.JobPlan({}, 1, sweep_pid=os.getpid(), live_line=True))("in the sweep's own process")
    assert out.getvalue() == "in the sweep's own process\n"  # rich's live display prints it above the line


@pytest.mark.slow
@pytest.mark.xdist_group("loky_workers")  # joblib's worker processes, started once, serve test_sweep's too
@pytest.mark.parametrize("launcher", ["basic", "joblib_cpu"])
def test_a_redirected_sweep_prints_its_progress(launcher, uea_fixture, workdir, monkeypatch, capsys):
    """Two tiny jobs, one of which fails at its first step (eps -1: the optimiser raises inside
    the run): a line with the counts and the time left as each finishes, whichever process runs them.
    The job that crashes is recorded with its error; the other job of the sweep still runs and the
    exit status counts the failure."""
    monkeypatch.setattr(sweep_progress, "POLL_S", 0.1)
    args = [*tiny(workdir), "trainer.max_epochs=1", "model=softmax", "trainer.optimizer.eps=-1.0,1e-8"]
    if launcher != "basic":
        args.append(f"hydra/launcher={launcher}")
    assert sweep(*args) == 1
    out = capsys.readouterr().out
    rows = csv_store.read_records(workdir / "res.csv")
    by_eps = {r["overrides"].split("trainer.optimizer.eps=")[1].split()[0]: r for r in rows}
    assert by_eps["-1.0"]["status"] == "failed" and "epsilon" in by_eps["-1.0"]["error"]
    assert by_eps["1e-08"]["status"] == "ok" or by_eps.get("1e-8", {}).get("status") == "ok"
    assert "1 of 2 jobs did not finish ok" in out
    lines = progress_lines(out)
    if launcher == "basic":  # one job after the other: the failed one (first) has a line, with the time left
        assert lines[0][:2] == (0, 1) and lines[0][4] != "?"
    # joblib's two workers may finish in either order, or within one poll of each other
    assert all(line[4] != "?" for line in lines if sum(line[:2]) == 1)
    assert lines[-1] == (1, 1, 0, 0, "0 s") and all(sum(line[:4]) == 2 for line in lines)
