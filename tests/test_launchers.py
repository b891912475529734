"""Launchers that run: a sweep through submitit's local executor (real subprocesses), a Slurm
launcher where no Slurm is reachable (one line), and the process layout of a 2-node x 2-task
`slurm_ddp` job from its Slurm environment (ranks, world size, master address, devices)."""
from __future__ import annotations

import pytest
import torch

from bench_cli.engine import distributed as D
from bench_cli.results.records import read_records
from test_sweep import sweep, tiny


def test_a_slurm_launcher_off_a_cluster_is_one_line(uea_fixture, workdir, capsys, monkeypatch):
    monkeypatch.setenv("PATH", str(workdir))  # no sbatch here
    for launcher in ("slurm", "slurm_ddp"):
        assert sweep(*tiny(workdir), f"hydra/launcher={launcher}") == 2
        err = capsys.readouterr().err
        assert "no Slurm is reachable from here" in err and "hydra/launcher=local" in err
        assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert not (workdir / "res.csv").exists()


@pytest.mark.parametrize("node, localid", [(0, 0), (0, 1), (1, 0), (1, 1)])
def test_two_nodes_of_two_tasks_from_the_slurm_environment(monkeypatch, node, localid):
    """What each of the 4 processes of `hydra/launcher=slurm_ddp hydra.launcher.nodes=2
    hydra.launcher.tasks_per_node=2` sees (SLURM_PROCID counts tasks over the nodes) and makes of it."""
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PATH", "/nonexistent")  # no scontrol: the node list is expanded here
    procid = 2 * node + localid
    monkeypatch.setenv("SLURM_PROCID", str(procid))
    monkeypatch.setenv("SLURM_NTASKS", "4")
    monkeypatch.setenv("SLURM_LOCALID", str(localid))
    monkeypatch.setenv("SLURM_NODELIST", "gpu[07-08]")
    monkeypatch.setenv("SLURM_JOB_ID", "123456")
    env = D.launch_env()
    assert (env.rank, env.world_size, env.local_rank) == (procid, 4, localid)
    import os

    assert os.environ["MASTER_ADDR"] == "gpu07" and os.environ["MASTER_PORT"] == str(20000 + 123456 % 20000)
    assert D.device_for(env, torch.device("cuda")) == torch.device("cuda", localid)  # one GPU per local task
    assert D.device_for(env, torch.device("cpu")) == torch.device("cpu")
    assert env.is_main == (procid == 0)


@pytest.mark.slow
def test_a_two_job_sweep_through_submitit_local_processes(uea_fixture, workdir, capsys):
    args = [*tiny(workdir), "trainer.num_threads=1", "trainer.progress=false", "seed=0,1", "hydra/launcher=local",
            "hydra.launcher.timeout_min=5"]
    assert sweep(*args) == 0, capsys.readouterr()
    # the jobs print into their own log files: the sweep's progress lines are what the terminal shows
    assert "sweep progress: 2 done, 0 failed, 0 running, 0 to go" in capsys.readouterr().out
    rows = read_records(workdir / "res.csv")
    assert sorted((r["seed"], r["status"]) for r in rows) == [("0", "ok"), ("1", "ok")]
    assert len({r["output_dir"] for r in rows}) == 2


@pytest.mark.slow
def test_sigusr1_to_a_local_launcher_job_then_the_same_sweep_resumes_it(uea_fixture, workdir):
    """Slurm's warning signal to a sweep job running in its own process (submitit's local executor):
    the job writes a checkpoint and records `interrupted (SIGUSR1)`; the same sweep command again
    resumes the job to the record of an uninterrupted run."""
    import json
    import os
    import signal
    import subprocess
    import time

    from conftest import ATTNBENCH, attnbench
    from test_checkpoint import assert_same_result

    args = [*[a for a in tiny(workdir) if not a.startswith(("trainer.max_epochs", "results.path"))],
            "trainer.max_epochs=12", "trainer.num_threads=1", "trainer.progress=false"]
    straight = attnbench("run", *args, f"results.path={workdir / 'straight.csv'}")
    assert straight.returncode == 0, straight.stderr
    sweep_args = [*args, f"results.path={workdir / 'res.csv'}", "hydra/launcher=local", "hydra.launcher.timeout_min=5"]
    proc = subprocess.Popen([str(ATTNBENCH), "sweep", *sweep_args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    try:
        claims, deadline = workdir / "res.csv.claims", time.monotonic() + 180
        while not list(workdir.glob("checkpoints/*/ckpt-*.pt")):  # the job's first evaluation is saved
            assert proc.poll() is None, proc.stdout.read()
            assert time.monotonic() < deadline, "the job never wrote a checkpoint"
            time.sleep(0.05)
        (claim,) = json.loads(claims.read_text()).values()
        os.kill(int(claim["pid"]), signal.SIGUSR1)
        out = proc.communicate(timeout=120)[0]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 1 and "interrupted (SIGUSR1)" in out and "Traceback" not in out, out
    assert "checkpoints of 1 unfinished jobs: " in out and f"in {workdir / 'checkpoints'} (the same command resumes them)" in out
    (first,) = read_records(workdir / "res.csv")
    assert first["status"] == "interrupted" and first["error"] == "interrupted (SIGUSR1)"
    again = attnbench("sweep", *sweep_args)
    assert again.returncode == 0, again.stdout + again.stderr
    resumed = read_records(workdir / "res.csv")[-1]
    assert_same_result(read_records(workdir / "straight.csv")[-1], resumed)
