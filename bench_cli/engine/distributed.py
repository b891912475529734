"""Data-parallel training over several processes (``trainer.strategy=ddp``).

Launch one process per device with torchrun (``torchrun --nproc_per_node N -m bench_cli.cli run
trainer.strategy=ddp ...``) or as the tasks of one Slurm job (the submitit launcher with
``tasks_per_node``: conf/hydra/launcher/slurm_ddp.yaml). Every process composes the same config;
rank 0 chooses the run id and writes the record.

What the strategy changes, nothing else (bench_cli/engine/trainer.py):
- ``trainer.batch_size`` stays the *global* batch: each of the W processes loads batch_size / W
  samples, and DistributedDataParallel averages the gradients, so a step sees the same samples
  and the same mean gradient as one process with the whole batch;
- the training split is sharded by a DistributedSampler seeded with the run's seed (or the
  task's own distributed sampler, e.g. DeiT's repeated augmentation); evaluation splits by
  :class:`ShardSampler` (no padding, so every sample counts once);
- evaluations sum the metrics' statistics over the processes (``all_reduce_sums``) before the
  metric values are computed, so every process selects the same epoch; every process evaluates
  rank 0's buffers (``broadcast_buffers``: BatchNorm's statistics);
- only rank 0 measures, logs and appends the record;
- checkpoints (bench_cli.engine.checkpoint): rank 0 gathers what differs between the processes
  (their random states, the loader's, the training losses not yet read) and writes one file; every
  process reads it to resume; a termination signal to any one process stops all of them at the
  same step (``StopVote``).

The backend is NCCL on CUDA and gloo on the CPU (the tests run 2 CPU processes with gloo).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.utils.data import Sampler

from bench_cli.core.errors import UserError, pending_signal, signal_pending

STRATEGIES = ("none", "ddp")


@dataclass(frozen=True)
class DistEnv:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def active(self) -> bool:
        return self.world_size > 1 or dist.is_initialized()

    @property
    def is_main(self) -> bool:
        return self.rank == 0


SINGLE = DistEnv()


def launch_env() -> DistEnv | None:
    """The process's place in a launch: torchrun's RANK / WORLD_SIZE / LOCAL_RANK, else Slurm's
    SLURM_PROCID / SLURM_NTASKS / SLURM_LOCALID (tasks of one job step); None outside both."""
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        return DistEnv(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ.get("LOCAL_RANK", 0)))
    if "SLURM_PROCID" in os.environ and int(os.environ.get("SLURM_NTASKS", "1")) > 1:
        env = DistEnv(int(os.environ["SLURM_PROCID"]), int(os.environ["SLURM_NTASKS"]),
                      int(os.environ.get("SLURM_LOCALID", 0)))
        os.environ.setdefault("MASTER_ADDR", _slurm_master())
        os.environ.setdefault("MASTER_PORT", str(20000 + int(os.environ.get("SLURM_JOB_ID", "0")) % 20000))
        return env
    return None


def _slurm_master() -> str:
    """The first host of the job's node list (what torchrun's MASTER_ADDR would be)."""
    import subprocess

    nodes = os.environ.get("SLURM_JOB_NODELIST") or os.environ.get("SLURM_NODELIST") or "localhost"
    try:
        out = subprocess.run(["scontrol", "show", "hostnames", nodes], capture_output=True, text=True, timeout=30)
        if out.returncode == 0 and out.stdout.split():
            return out.stdout.split()[0]
    except OSError:
        pass
    return first_host(nodes)


def first_host(nodelist: str) -> str:
    """The first host of a Slurm node list in its compressed form, as ``scontrol show hostnames``
    gives it: 'node[01-02,05],gpu7' -> 'node01', 'rack[1-2]-n[3-4]' -> 'rack1-n3'."""
    import re

    depth, end = 0, len(nodelist)
    for i, ch in enumerate(nodelist):  # the first entry: up to a comma outside brackets
        depth += (ch == "[") - (ch == "]")
        if ch == "," and depth == 0:
            end = i
            break
    return re.sub(r"\[([^\]]*)\]", lambda m: m.group(1).split(",")[0].split("-")[0], nodelist[:end])


def setup(strategy: str, device_name: str = "auto") -> DistEnv:
    """Join the process group for ``strategy`` (idempotent); SINGLE for ``none``."""
    if strategy not in STRATEGIES:
        from bench_cli.core.errors import unknown_choice

        raise unknown_choice("trainer.strategy", strategy, STRATEGIES)
    if strategy == "none":
        return SINGLE
    if dist.is_initialized():
        return DistEnv(dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", 0)))
    env = launch_env()
    if env is None:
        raise UserError("trainer.strategy=ddp needs one process per device: launch with "
                        "`torchrun --nproc_per_node N -m bench_cli.cli run trainer.strategy=ddp ...` "
                        "(or the Slurm launcher hydra/launcher=slurm_ddp)")
    cuda = torch.cuda.is_available() and device_name in ("auto", "cuda") or device_name.startswith("cuda")
    if cuda:
        torch.cuda.set_device(env.local_rank)
    dist.init_process_group("nccl" if cuda else "gloo", rank=env.rank, world_size=env.world_size,
                            timeout=timedelta(minutes=30))
    return env


def device_for(env: DistEnv, device: torch.device) -> torch.device:
    """One CUDA device per local process; the CPU stays the CPU."""
    if env.active and device.type == "cuda" and device.index is None:
        return torch.device("cuda", env.local_rank)
    return device


def shutdown() -> None:
    _vote_group.clear()
    if dist.is_initialized():
        dist.destroy_process_group()


def all_reduce_sums(stats: dict[str, float], same_keys: bool = False) -> dict[str, float]:
    """Sums of summable statistics over every process (float64; keys in a fixed order). Unless
    ``same_keys``, the keys are gathered first (a process with an empty shard has none)."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return stats
    keys = sorted(stats)
    if not same_keys:
        every: list = [None] * dist.get_world_size()
        dist.all_gather_object(every, keys)
        keys = sorted(set().union(*every))
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")
    t = torch.tensor([float(stats.get(k, 0.0)) for k in keys], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return dict(zip(keys, t.tolist()))


def broadcast_buffers(model: torch.nn.Module) -> None:
    """Rank 0's buffers (BatchNorm's running statistics) on every process, as DistributedDataParallel
    itself does before each training forward (its ``broadcast_buffers``); timm's train.py does the
    same before it validates (``distribute_bn``). Between a step and the next forward each process
    holds the statistics of its own shard of the batch: without this an evaluation would score
    each shard with another model, and a checkpoint (rank 0's weights) would not be the model
    every process evaluated."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return
    for buffer in model.buffers():
        dist.broadcast(buffer.data, src=0)


def broadcast(value):
    """Rank 0's ``value`` on every process (a picklable object)."""
    if not dist.is_initialized():
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


class ShardSampler(Sampler[int]):
    """Indices rank, rank + W, rank + 2W, ... of a dataset: every sample on exactly one process,
    no padding (evaluation sums statistics, so unequal shards are fine)."""

    def __init__(self, n: int, rank: int, world_size: int):
        self.n, self.rank, self.world_size = n, rank, world_size

    def __iter__(self):
        return iter(range(self.rank, self.n, self.world_size))

    def __len__(self) -> int:
        return len(range(self.rank, self.n, self.world_size))


def gather_to_main(value) -> list | None:
    """Every process's ``value`` (picklable, on the CPU) on rank 0, in rank order; None elsewhere."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return [value]
    every = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
    dist.gather_object(value, every, dst=0)
    return every


def every_process(value) -> list:
    """Every process's ``value`` (picklable) on every process, in rank order."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return [value]
    every: list = [None] * dist.get_world_size()
    dist.all_gather_object(every, value)
    return every


_vote_group: list = []  # the CPU (gloo) group StopVote's votes travel in, made once per process group


class StopVote:
    """When a distributed run stops at a termination signal: a signal reaches one process (Slurm's
    SIGUSR1 to a task, a SIGTERM to one rank), and every process must stop after the same
    optimiser step, take part in one checkpoint and exit as interrupted; a process that stopped
    alone would leave the others waiting in their next collective until its 30-minute timeout.

    Why a vote after every step, answered one step later: the processes must agree on the step,
    so each says at each step whether it holds a signal, and the largest answer is what all of
    them see. Voting only at evaluations and checkpoints costs nothing per step, but an epoch of
    ImageNet (DeiT) is longer than the warning Slurm gives before a time limit (``--signal``'s
    seconds): the run would be killed before it got there. Voting synchronously at every step
    with a tensor of the training device would read a CUDA tensor on the host: a host-device
    sync per step, what the loop avoids (``_Loop`` in bench_cli.engine.trainer). So the vote is a
    one-number CPU tensor all-reduced (MAX: the signal's number, 0 for none) in a gloo group of
    its own (never the device, whatever the backend; its own group so that it never interleaves
    with DDP's gradient all-reduces), started without waiting (``async_op``) after step s and
    read after step s + 1, by which time it has long arrived: every process stops after step
    s + 1. On one process it is the plain check of ``signal_pending``."""

    def __init__(self, env: DistEnv):
        self.active = env.world_size > 1
        if self.active and not _vote_group:
            _vote_group.append(dist.new_group(backend="gloo"))  # a collective: every process makes it here
        self.ballot: torch.Tensor | None = None
        self.work = None  # the vote under way
        self.agreed = 0  # the signal every process saw in the last vote (0: none)

    def _count(self) -> int:
        """The result of the vote under way (0: none under way)."""
        if self.work is None:
            return 0
        self.work.wait()
        self.work = None
        return int(self.ballot[0])

    def _vote(self, signum: int, wait: bool) -> None:
        self.ballot = torch.tensor([signum], dtype=torch.int32)
        self.work = dist.all_reduce(self.ballot, op=dist.ReduceOp.MAX, group=_vote_group[0], async_op=True)
        if wait:
            self.work.wait()

    def after_step(self) -> bool:
        """Whether every process stops at this step boundary; called once after each optimiser
        step by every process. The previous step's vote is counted, this step's is started."""
        if not self.active:
            return bool(signal_pending())
        self.agreed = self._count()
        if not self.agreed:
            self._vote(signal_pending(), wait=False)
        return bool(self.agreed)

    def at_boundary(self) -> int | None:
        """The signal every process stops at here (None: none; cleared). Called by every process
        at each place the fit can be saved (after ``after_step`` said stop, or at the end of an
        epoch or of the fit): a vote counted now unless ``after_step`` agreed already."""
        signum = pending_signal() or 0
        if not self.active:
            return signum or None
        agreed, self.agreed = self.agreed, 0
        if not agreed:
            earlier = self._count()
            self._vote(signum, wait=True)
            agreed = max(earlier, self._count())
        return agreed or None
