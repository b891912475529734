"""Checkpoints and exact resume of a distributed run (``trainer.strategy=ddp``, 2 gloo processes on
the CPU): a termination signal to ONE of the processes stops both after the same step, rank 0
writes one checkpoint with both processes' random states and pending losses, both exit as
interrupted; the same command again resumes each process from its own part, to the record of an
uninterrupted run (every column but times, dates and paths).

The two processes are forked from a forkserver that has imported a run's modules once
(tests/ddp_processes.py: a torchrun process would import torch, Hydra and the readers again, about
5 s each on 2 cores).
"""
from __future__ import annotations

import re
import signal
from pathlib import Path

import pytest

from bench_cli.commands.cli import main
from bench_cli.engine.checkpoint import read
from bench_cli.results.csv_store import read_records
from ddp_processes import as_one_process, run_ranks
from test_checkpoint import UEA, assert_same_result

# In one xdist worker with the other tests that fork from tests/ddp_processes.py's preloaded
# forkserver (tests/command_processes.py): its start, 4-5 s of imports, is paid once.
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("single_thread"), pytest.mark.xdist_group("forkserver")]

# dropout on (the task's default, said here because it matters): each process draws its own
# stream, which the checkpoint must give back to each
DDP = [*UEA, "trainer.strategy=ddp", "trainer.max_epochs=2", "task.backbone.dropout=0.1"]

def test_a_signal_to_one_process_stops_both_at_one_step_and_they_resume_to_the_uninterrupted_record(
        uea_fixture, workdir):
    """Rank 1 SIGTERMed after step 2 (rank 0 has no signal): both stop after step 3, inside epoch
    1, so the resumed processes draw their DistributedSampler shards of that epoch again and skip
    3 batches; rank 0's checkpoint holds both processes' random states."""
    codes, output = run_ranks(workdir, [*DDP, "results.path=straight/res.csv"])
    assert codes == [0, 0], output
    reference = read_records("straight/res.csv")[-1]
    assert reference["device"] == "cpu x 2 processes" and len(read_records("straight/res.csv")) == 1

    codes, output = run_ranks(workdir, [*DDP, "results.path=cut/res.csv"], (1, 2, "SIGTERM"))
    assert codes == [128 + signal.SIGTERM] * 2, output  # both exit as interrupted by that signal
    first = read_records("cut/res.csv")[-1]
    assert first["status"] == "interrupted" and first["error"] == "interrupted (SIGTERM)", output
    (path,) = Path(first["checkpoint_dir"]).glob("ckpt-*.pt")
    state = read(path)
    # both stopped after the step following the signalled one: the vote is counted one step later
    assert (state["position"]["epoch"], state["position"]["batches"], state["position"]["step"]) == (1, 3, 3)
    ranks = state["ranks"]
    assert len(ranks) == 2 and ranks[0]["rng"]["torch"].ne(ranks[1]["rng"]["torch"]).any()

    codes, output = run_ranks(workdir, [*DDP, "results.path=cut/res.csv"])
    assert codes == [0, 0], output
    assert "resuming from" in output
    assert_same_result(reference, read_records("cut/res.csv")[-1])
    assert len(read_records("cut/res.csv")) == 2  # rank 0 alone records


def test_a_signal_to_rank_0_stops_both_and_one_process_refuses_their_checkpoint(uea_fixture, workdir, monkeypatch,
                                                                               capsys):
    """Rank 0 SIGUSR1ed (Slurm's warning) after step 5: rank 1 stops after step 6 with it. Each
    process resumes its own random streams, so the checkpoint of 2 processes resumed by 1 (the same
    job: ``trainer.strategy=ddp`` on one process) is one line, before anything trains."""
    codes, output = run_ranks(workdir, [*DDP, "results.path=res.csv"], (0, 5, "SIGUSR1"))
    assert codes == [128 + signal.SIGUSR1] * 2, output
    first = read_records("res.csv")[-1]
    assert first["status"] == "interrupted" and first["error"] == "interrupted (SIGUSR1)", output
    (path,) = Path(first["checkpoint_dir"]).glob("ckpt-*.pt")
    assert (read(path)["position"]["epoch"], read(path)["position"]["step"]) == (2, 6)
    as_one_process(monkeypatch)
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        main(["run", *DDP, "results.path=res.csv"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert f"checkpoint {path} was written by 2 processes, this run has 1" in err and "Traceback" not in err, err
    main(["evaluate", str(path), "--split", "val"])  # its weights on one process, without a process group
    assert re.search(r"accuracy\W+\d", capsys.readouterr().out)
