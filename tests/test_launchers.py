"""Launchers that run: a sweep through submitit's local executor (real subprocesses), a Slurm
launcher where no Slurm is reachable (one line), and the process layout of a 2-node x 2-task
`slurm_ddp` job from its Slurm environment (ranks, world size, master address, devices). GPU
sweeps planned on a machine without a GPU (a login node): the config is checked by the plan, the
hardware by each job where it runs (a failed record; the sweep goes on)."""
from __future__ import annotations

import pytest
import torch

from bench_cli.engine import distributed
from bench_cli.results.csv_store import read_records
from test_sweep import sweep, tiny


@pytest.fixture
def login_node(monkeypatch, workdir):
    """A machine without CUDA and without Slurm's sbatch, wherever the suite runs."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    monkeypatch.setenv("PATH", str(workdir))


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
        # set, then removed: monkeypatch then puts back the variable's state from before the test,
        # and the MASTER_ADDR and MASTER_PORT that launch_env sets do not outlive it (delenv of an
        # unset variable records nothing to undo)
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    monkeypatch.setenv("PATH", "/nonexistent")  # no scontrol: the node list is expanded here
    procid = 2 * node + localid
    monkeypatch.setenv("SLURM_PROCID", str(procid))
    monkeypatch.setenv("SLURM_NTASKS", "4")
    monkeypatch.setenv("SLURM_LOCALID", str(localid))
    monkeypatch.setenv("SLURM_NODELIST", "gpu[07-08]")
    monkeypatch.setenv("SLURM_JOB_ID", "123456")
    env = distributed.launch_env()
    assert (env.rank, env.world_size, env.local_rank) == (procid, 4, localid)
    import os

    assert os.environ["MASTER_ADDR"] == "gpu07" and os.environ["MASTER_PORT"] == str(20000 + 123456 % 20000)
    assert distributed.device_for(env, torch.device("cuda")) == torch.device("cuda", localid)  # one GPU per local task
    assert distributed.device_for(env, torch.device("cpu")) == torch.device("cpu")
    assert env.is_main == (procid == 0)


def job_logs(workdir) -> str:
    """The end of each submitit job's own log files, for a failure's message: a job that dies before
    it records says why only there."""
    logs = sorted(workdir.glob("outputs/**/.submitit/*/*_log.*"))
    return "\n".join(f"--- {log.name}:\n" + "\n".join(log.read_text(errors="replace").splitlines()[-25:]) for log in logs)


@pytest.mark.slow
def test_a_two_job_sweep_through_submitit_local_processes(uea_fixture, workdir, capsys):
    args = [*tiny(workdir), "trainer.num_threads=1", "trainer.progress=false", "seed=0,1", "hydra/launcher=local",
            "hydra.launcher.timeout_min=5"]
    assert sweep(*args) == 0, (capsys.readouterr(), job_logs(workdir))
    # the jobs print into their own log files: the sweep's progress lines are what the terminal shows
    assert "sweep progress: 2 done, 0 failed, 0 running, 0 to go" in capsys.readouterr().out
    rows = read_records(workdir / "res.csv")
    assert sorted((r["seed"], r["status"]) for r in rows) == [("0", "ok"), ("1", "ok")]
    assert len({r["output_dir"] for r in rows}) == 2


@pytest.mark.slow
def test_sigusr1_to_a_local_launcher_job_then_the_same_sweep_resumes_it(uea_fixture, workdir, capsys):
    """Slurm's warning signal to a sweep job running in its own process (submitit's local executor):
    the job writes a checkpoint and records `interrupted (SIGUSR1)`; the same sweep command again
    resumes the job to the record of an uninterrupted run. (Both sweeps run in this process, the
    signal sent from a thread: only the job's process is signalled, and it is submitit's.)"""
    import json
    import os
    import signal
    import threading
    import time

    from bench_cli.commands.cli import main
    from test_checkpoint import assert_same_result

    args = [*[a for a in tiny(workdir) if not a.startswith(("trainer.max_epochs", "results.path"))],
            "trainer.max_epochs=12", "trainer.num_threads=1", "trainer.progress=false"]
    main(["run", *args, f"results.path={workdir / 'straight.csv'}"])  # the uninterrupted run, in this process
    sweep_args = [*args, f"results.path={workdir / 'res.csv'}", "hydra/launcher=local", "hydra.launcher.timeout_min=5"]
    signalled = []

    def signal_the_job_at_its_first_checkpoint():
        claims, deadline = workdir / "res.csv.claims", time.monotonic() + 180
        while not list(workdir.glob("checkpoints/*/ckpt-*.pt")):  # the job's first evaluation is saved
            if time.monotonic() > deadline:
                return
            time.sleep(0.05)
        (claim,) = json.loads(claims.read_text()).values()
        os.kill(int(claim["pid"]), signal.SIGUSR1)
        signalled.append(int(claim["pid"]))

    signaller = threading.Thread(target=signal_the_job_at_its_first_checkpoint, daemon=True)
    signaller.start()
    capsys.readouterr()
    code = sweep(*sweep_args)
    signaller.join(timeout=10)
    out, err = capsys.readouterr()
    assert signalled and signalled[0] != os.getpid(), "the job never wrote a checkpoint: " + out
    assert code == 1 and "interrupted (SIGUSR1)" in out and "Traceback" not in out + err, out + err
    assert "checkpoints of 1 unfinished jobs: " in out and f"in {workdir / 'checkpoints'} (the same command resumes them)" in out
    (first,) = read_records(workdir / "res.csv")
    assert first["status"] == "interrupted" and first["error"] == "interrupted (SIGUSR1)"
    assert sweep(*sweep_args) == 0  # the same sweep again: its job runs in a process of its own
    resumed = read_records(workdir / "res.csv")[-1]
    assert_same_result(read_records(workdir / "straight.csv")[-1], resumed)


# --- GPU sweeps from a machine without a GPU ---------------------------------------------------
def test_deits_fp16_sweeps_are_planned_and_dry_run_on_a_machine_without_a_gpu(login_node, workdir, capsys):
    """DeiT's Table 3 (trainer.precision=fp16) as a data-parallel Slurm sweep, and as it is (one
    model's row: each model is a composition of its own, a second or so here)."""
    for extra, n in ((["hydra/launcher=slurm_ddp", "trainer.strategy=ddp"], 20), (["model=softmax"], 5)):
        assert sweep("--dry-run", "experiment=primal_dual/table3", *extra) == 0
        out = capsys.readouterr().out
        assert f"{n} jobs, 0 already done, {n} to run" in out and "data missing" in out  # ImageNet: by hand
        assert f"{n} of {n} jobs to run ask for what this machine lacks" in out and "fp16 needs CUDA" in out


def test_a_cuda_sweep_is_submitted_from_a_machine_without_a_gpu_up_to_the_missing_sbatch(login_node, workdir,
                                                                                         uea_fixture, capsys):
    gpu = [*tiny(workdir), "trainer.device=cuda", "hydra/launcher=slurm"]
    assert sweep("--dry-run", *gpu) == 0
    assert "1 of 1 jobs to run ask for what this machine lacks" in capsys.readouterr().out
    assert sweep(*gpu) == 2
    err = capsys.readouterr().err.strip()
    assert "no Slurm is reachable from here" in err and len(err.splitlines()) == 1
    assert not (workdir / "res.csv").exists()


def test_a_job_without_the_hardware_it_asks_for_is_a_recorded_failure_and_the_sweep_goes_on(login_node, workdir,
                                                                                             uea_fixture, capsys):
    """Run here (the basic launcher, in this process): trainer.device=cuda, and DeiT's fp16 where
    auto is the CPU, are each a failed record with one line, and every job after the first still runs."""
    assert sweep(*tiny(workdir), "trainer.device=cuda,auto", "trainer.precision=fp16", "seed=0,1") == 4
    out = capsys.readouterr().out
    rows = read_records(workdir / "res.csv")
    assert len(rows) == 4 and {r["status"] for r in rows} == {"failed"}
    errors = {r["overrides"].split("trainer.device=")[1].split()[0]: r["error"] for r in rows}
    assert errors["cuda"] == "UserError: trainer.device=cuda but CUDA is not available here; use trainer.device=auto or cpu"
    assert errors["auto"].startswith("UserError: trainer.precision=fp16 needs CUDA (autocast + GradScaler) and this "
                                     "machine has none (trainer.device=auto)")
    assert "4 of 4 jobs did not finish ok" in out and "Traceback" not in out and "no record" not in out


def test_a_config_mistake_in_a_gpu_sweep_is_refused_at_planning(login_node, workdir, capsys):
    gpu = ["experiment=primal_dual/table3", "hydra/launcher=slurm_ddp", "trainer.strategy=ddp", "--dry-run"]
    for extra, expected in ((["model=softmax,no_such_model"], "unknown model 'no_such_model'"),
                            (["model=softmax", "seed=0", "task.backbone.n_heads=5"], "task.backbone.n_heads=5 does not divide"),
                            (["model=softmax", "seed=0", "trainer.device=gpu"], "valid: auto, cpu, cuda, cuda:N"),
                            (["model=softmax", "seed=0", "trainer.device=cpu"], "fp16 needs CUDA (autocast + GradScaler); on the CPU")):
        assert sweep(*gpu, *extra) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and expected in err, err


def test_what_a_job_asks_of_its_gpu_node_is_checked_where_it_runs(monkeypatch):
    """engine/env.check_hardware on a node with 2 GPUs: cuda:N among them, one GPU per local
    process of a data-parallel job."""
    from bench_cli.config.compose import compose
    from bench_cli.core.errors import UserError
    from bench_cli.engine.env import check_hardware

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    check_hardware(compose(["trainer.device=cuda:1", "trainer.precision=fp16"]))
    with pytest.raises(UserError, match=r"trainer.device=cuda:2 but this machine has 2 CUDA devices \(cuda:0 to cuda:1\)"):
        check_hardware(compose(["trainer.device=cuda:2"]))
    monkeypatch.setenv("SLURM_NTASKS", "3")
    monkeypatch.setenv("SLURM_PROCID", "2")
    monkeypatch.setenv("SLURM_LOCALID", "2")
    monkeypatch.setenv("MASTER_ADDR", "localhost")
    with pytest.raises(UserError, match="local process 2 takes cuda:2, but this node has 2 CUDA devices"):
        check_hardware(compose(["trainer.device=cuda", "trainer.strategy=ddp"]))
