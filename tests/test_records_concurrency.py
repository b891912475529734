"""Two sweeps of one records file at once (several nodes sharing one results folder): each job is claimed
under the records lock before it runs, so no job runs twice; a claim held by a live process is skipped and
said so, the claim of a dead process (kill -9) is taken over, and a rerun finds every job done."""
from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench_cli.results import claims, csv_store
from bench_cli.commands import sweep as sweep_command
from test_sweep import fake_runs, sweep, tiny  # noqa: F401  (fake_runs: a fixture, so the tests' parameters redefine it: noqa F811 there)


def start_time(pid: int) -> str:
    """/proc/PID/stat field 22: the process's start time (an independent reading of it)."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]


def hold_claim(path: Path, key: str, pid: int, host: str | None = None, process_start: str | None = None,
               heartbeat: str | None = None) -> None:
    """The claims file as another process that claimed ``key`` leaves it."""
    claim = {"pid": pid, "host": host or socket.gethostname(), "since": "2025-01-01T00:00:00+00:00",
             "process_start": process_start, "heartbeat": heartbeat}
    path.with_name(path.name + ".claims").write_text(json.dumps({key: claim}))


def ago(seconds: float) -> str:
    from datetime import datetime, timedelta, timezone

    return (datetime.now(timezone.utc) - timedelta(seconds=seconds)).isoformat(timespec="seconds")


def test_a_running_job_refreshes_its_claim_in_the_background(tmp_path):
    path = tmp_path / "runs.csv"
    assert claims.claim_job(path, "k1")[0]
    claims_file = path.with_name("runs.csv.claims")
    old = {"k1": {**json.loads(claims_file.read_text())["k1"], "heartbeat": ago(300)}}
    claims_file.write_text(json.dumps(old))
    with claims.heartbeat(path, "k1", every_s=0.05):
        time.sleep(0.5)  # no epoch boundary here: the thread beats on its own
    assert claims.heartbeat_age(json.loads(claims_file.read_text())["k1"]) < 5


@pytest.fixture
def sleeper():
    """A live process of this host (a claim it holds is alive), killed at the end."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    yield proc
    proc.kill()
    proc.wait()


def test_claims_skip_live_processes_and_take_over_dead_ones(tmp_path, sleeper):
    path = tmp_path / "runs.csv"
    hold_claim(path, "k1", sleeper.pid, process_start=start_time(sleeper.pid))
    assert claims.claim_job(path, "k1") == (False, f"running in pid {sleeper.pid} since 2025-01-01T00:00:00+00:00")
    fresh = ago(60)  # another host's claim lives while its heartbeat is younger than the time-to-live
    hold_claim(path, "k1", 4242, host="another-node", heartbeat=fresh)
    claimed, why = claims.claim_job(path, "k1")
    assert not claimed and "running in pid 4242 on another-node" in why and re.search(r"\(heartbeat 6[0-2] s ago\)$", why)
    stale = ago(11 * 60)
    hold_claim(path, "k1", 4242, host="another-node", heartbeat=stale)
    claimed, note = claims.claim_job(path, "k1")
    assert claimed and note == (f"taking over the claim of pid 4242 on another-node (since 2025-01-01T00:00:00+00:00), "
                                f"last heartbeat {stale}, 11 min ago, over the 10 min time-to-live")
    hold_claim(path, "k1", 4242, host="another-node", heartbeat=fresh)
    assert claims.claim_job(path, "k1", ttl_s=30)[0]  # results.claim_ttl_s

    sleeper.kill()
    sleeper.wait()
    hold_claim(path, "k1", sleeper.pid)
    claimed, note = claims.claim_job(path, "k1")  # kill -9 left its claim behind
    assert claimed and f"taking over the claim of pid {sleeper.pid}" in note
    assert claims.claim_job(path, "k1") == (True, "")  # this process's own claim
    claims.release_job(path, "k1")
    assert not path.with_name("runs.csv.claims").exists()

    csv_store.append_record(path, {"run_id": "r1", "status": "ok", "job_key": "k2"})
    assert claims.claim_job(path, "k2") == (False, "done by another process (ok record r1)")
    assert claims.claim_job(path, "k2", ok_rows_from=1)[0]  # --force: rows from before the sweep are rerun


def test_a_heartbeat_ahead_of_this_clock_is_trusted_only_within_the_time_to_live(tmp_path):
    """Another host's clock may be wrong: a heartbeat a little ahead of this host's clock is a live
    claim (said as ahead, not as a negative age); one further ahead than the time-to-live (a clock
    set to 2099) is not trusted, so it cannot claim its job for ever: it is taken over and the line
    that says so names the skew."""
    path = tmp_path / "runs.csv"
    hold_claim(path, "k1", 4242, host="another-node", heartbeat=ago(-30))
    claimed, why = claims.claim_job(path, "k1")
    assert not claimed and re.search(r"\(heartbeat (29|30) s ahead of this host's clock\)$", why), why
    future = "2099-01-01T00:00:00+00:00"
    hold_claim(path, "k1", 4242, host="another-node", heartbeat=future)
    held = json.loads(path.with_name("runs.csv.claims").read_text())["k1"]
    assert not claims.claim_alive(held) and claims.claim_state(held).startswith("stale claim of pid 4242")
    claimed, note = claims.claim_job(path, "k1")
    assert claimed and note.startswith(f"taking over the claim of pid 4242 on another-node (since 2025-01-01T00:00:00+00:00), "
                                       f"last heartbeat {future}, ")
    assert note.endswith(" ahead of this host's clock: a clock skew over the 10 min time-to-live, not trusted")
    assert len(note.splitlines()) == 1


def test_a_sweep_skips_a_job_another_process_runs_then_takes_it_over(uea_fixture, workdir, fake_runs, sleeper,  # noqa: F811
                                                                     capsys):
    args = [*tiny(workdir), "trainer.num_threads=1", "seed=0,1,2"]
    jobs = sweep_command.plan_sweep(args).jobs
    res = workdir / "res.csv"
    hold_claim(res, jobs[1].key, sleeper.pid, process_start=start_time(sleeper.pid))
    capsys.readouterr()
    assert sweep(*args) == 0  # a job another process runs is not a failure of this sweep
    out = capsys.readouterr().out
    assert [c.seed for c in fake_runs] == [0, 2]
    assert f"[sweep 2/3] skipped, running in pid {sleeper.pid}" in out and "1 running elsewhere" in out

    sleeper.kill()  # the other sweep dies (kill -9) before recording its job
    sleeper.wait()
    assert sweep(*args) == 0
    out = capsys.readouterr().out
    assert [c.seed for c in fake_runs] == [0, 2, 1] and f"taking over the claim of pid {sleeper.pid}" in out
    assert sweep(*args) == 0 and "nothing to do" in capsys.readouterr().out
    assert sorted(r["job_key"] for r in csv_store.read_records(res)) == sorted(j.key for j in jobs)
    assert not res.with_name("res.csv.claims").exists()


@pytest.mark.xdist_group("forkserver")  # the preloaded forkserver (tests/ddp_processes.py) started once
@pytest.mark.slow
def test_two_sweeps_at_once_run_each_job_once(uea_fixture, workdir, capsys):
    """Two sweeps of one CSV at once, both planning the same 3 jobs: an `attnbench sweep` process
    (forked from the preloaded forkserver, tests/command_processes.py) and, started as soon as that
    one has planned, the same sweep in the test's process. Each job runs once (one row per
    job_key), in one of the two; the other says it skipped it."""

    from command_processes import kill_if_alive, start_command

    args = [*tiny(workdir), "trainer.num_threads=1", "seed=0,1,2"]
    log = workdir / "a.log"
    proc = start_command(["sweep", *args], log)
    try:
        deadline = time.monotonic() + 120
        while "3 jobs, 0 already done" not in log.read_text():  # the process has planned: it launches now
            assert proc.is_alive() and time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        capsys.readouterr()
        codes = [sweep(*args)]
        in_process = capsys.readouterr().out
        proc.join(timeout=400)
        codes.insert(0, proc.exitcode)
    finally:
        kill_if_alive(proc)
    texts = [log.read_text(), in_process]
    assert codes == [0, 0], texts
    rows = csv_store.read_records(workdir / "res.csv")
    keys = [r["job_key"] for r in rows]
    assert len(keys) == 3 and len(set(keys)) == 3, texts
    assert {r["status"] for r in rows} == {"ok"}
    assert "".join(texts).count("start ") == 3, texts  # each job started once, in one of the two
    capsys.readouterr()
    assert sweep(*args, "--dry-run") == 0  # a rerun finds every job done
    assert "3 jobs, 3 already done" in capsys.readouterr().out


def test_a_claim_from_another_host_is_respected_while_fresh_and_taken_over_when_stale(uea_fixture, workdir,
                                                                                       fake_runs, capsys):  # noqa: F811
    """A job of a dead node: `sweep --dry-run` says running (host, heartbeat age) while the heartbeat
    is fresh and stale after the time-to-live; the sweep then takes it over in one line naming the
    host, the pid and the last heartbeat."""
    args = [*tiny(workdir), "trainer.num_threads=1"]
    (job,) = sweep_command.plan_sweep(args).jobs
    res = workdir / "res.csv"
    hold_claim(res, job.key, 4242, host="node42", heartbeat=ago(30))
    capsys.readouterr()
    assert sweep("--dry-run", *args) == 0
    assert re.search(r"running in pid 4242 on node42 .*\(heartbeat 3[0-2] s ago\)", " ".join(capsys.readouterr().out.split()))
    assert sweep(*args) == 0 and "1 running elsewhere" in capsys.readouterr().out and not fake_runs

    stale = ago(20 * 60)
    hold_claim(res, job.key, 4242, host="node42", heartbeat=stale)
    assert sweep("--dry-run", *args) == 0
    assert "stale claim of pid 4242 on node42" in " ".join(capsys.readouterr().out.split())
    assert sweep(*args) == 0
    out = capsys.readouterr().out
    assert f"taking over the claim of pid 4242 on node42 (since 2025-01-01T00:00:00+00:00), last heartbeat {stale}" in out
    assert len(fake_runs) == 1 and "1 ok" in out


def test_a_requeued_slurm_job_takes_over_its_own_earlier_claim(tmp_path, monkeypatch):
    """Slurm requeues a preempted job under the same SLURM_JOB_ID, possibly on another node, while
    the claim of its first incarnation still has a fresh heartbeat."""
    path = tmp_path / "runs.csv"
    claim = {"pid": 4242, "host": "node07", "since": ago(120), "heartbeat": ago(20), "slurm_job": "778"}
    path.with_name("runs.csv.claims").write_text(json.dumps({"k1": claim}))
    monkeypatch.setenv("SLURM_JOB_ID", "779")  # another job: the claim is live
    assert not claims.claim_job(path, "k1")[0]
    monkeypatch.setenv("SLURM_JOB_ID", "778")
    claimed, note = claims.claim_job(path, "k1")
    assert claimed and note.endswith("the same Slurm job 778, requeued") and "pid 4242 on node07" in note


def test_a_second_run_of_a_running_job_is_refused_naming_the_first(uea_fixture, workdir, sleeper, capsys):
    """Two identical `attnbench run` at once would train into one checkpoint folder: while one
    holds the job's claim (here a live process of this host), the second is refused in one line
    naming it and how to go on, before anything is created; without checkpoints nothing is shared
    and it runs. A run releases its own claim when it ends."""
    from bench_cli.commands.cli import main
    from test_faults import TINY

    args = ["run", *TINY, "trainer.max_epochs=1", "results.path=res.csv"]
    main(args)
    (first,) = csv_store.read_records(workdir / "res.csv")
    assert first["status"] == "ok" and not (workdir / "res.csv.claims").exists()
    hold_claim(workdir / "res.csv", first["job_key"], sleeper.pid, process_start=start_time(sleeper.pid))
    folders = sorted((workdir / "outputs").glob("runs/*/*"))
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        main(args)
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and len(err.splitlines()) == 1, err
    assert f"job_key {first['job_key']}) is already running in pid {sleeper.pid} since " in err
    assert "trainer.checkpoint.enabled=false" in err
    assert sorted((workdir / "outputs").glob("runs/*/*")) == folders and len(csv_store.read_records(workdir / "res.csv")) == 1
    main([*args, "trainer.checkpoint.enabled=false"])
    assert [r["status"] for r in csv_store.read_records(workdir / "res.csv")] == ["ok", "ok"]
    assert json.loads((workdir / "res.csv.claims").read_text())[first["job_key"]]["pid"] == sleeper.pid  # left alone
