"""Launchers that run: a sweep through submitit's local executor (real subprocesses), a Slurm
launcher where no Slurm is reachable (one line), and the process layout of a 2-node x 2-task
`slurm_ddp` job from its Slurm environment (ranks, world size, master address, devices)."""
from __future__ import annotations

import pytest
import torch

from bench_cli import distributed as D
from bench_cli.records import read_records
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
    rows = read_records(workdir / "res.csv")
    assert sorted((r["seed"], r["status"]) for r in rows) == [("0", "ok"), ("1", "ok")]
    assert len({r["output_dir"] for r in rows}) == 2
