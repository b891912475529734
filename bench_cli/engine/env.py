"""The environment of one run, prepared before anything is built: the processes (``trainer.strategy``,
bench_cli/engine/distributed.py), the device, the intra-op threads, the seeds and the precision.

``prepare_environment(cfg)`` does it once, first; the ``Environment`` it returns is what the rest of
the run reads (the device, ``autocast()`` for ``trainer.precision``, the process's rank) instead of
the config. The helpers below it are also what the commands that build a model outside a run
(evaluate, profile, smoke, bench-overhead) use, so every path picks and seeds the same way.

``check_hardware(cfg)`` is the one place that says which checks are about the machine a run runs
on (a CUDA device, fp16, one GPU per local process of a data-parallel job); it runs first in
``prepare_environment``, where the job runs, and in `run` and `validate` before anything is built.
A sweep's plan leaves it to each job: the login node that plans and submits a cluster's GPU jobs
has no GPU itself. What a config says wrong anywhere (a device name torch does not know, fp16 on
``trainer.device=cpu``) is the config's check (bench_cli/commands/validate.py), at planning time.
"""
from __future__ import annotations

import contextlib
import os
import random
import sys
from dataclasses import dataclass

import numpy as np
import torch

from bench_cli.core.errors import UserError, unknown_choice
from bench_cli.engine import distributed

PRECISIONS = ("32", "bf16", "fp16")
DEVICES = ("auto", "cpu", "cuda", "cuda:N")  # trainer.device's forms (conf/trainer/default.yaml)


@dataclass(frozen=True)
class Environment:
    """Where and how this process runs: its device, the run's seed (``deterministic``: torch's
    deterministic algorithms), ``trainer.precision`` and its place among the processes."""

    device: torch.device
    seed: int
    deterministic: bool
    precision: str
    dist: distributed.DistEnv = distributed.SINGLE

    @property
    def is_main(self) -> bool:
        """Rank 0: the process that measures, logs and writes the record."""
        return self.dist.is_main

    @property
    def description(self) -> str:
        """The record's ``device``: 'cpu', 'cuda:0 x 4 processes'."""
        return str(self.device) + (f" x {self.dist.world_size} processes" if self.dist.world_size > 1 else "")

    def seed_everything(self) -> None:
        """Every generator at the run's seed: called again before the model is built, so its
        initial weights do not depend on how much randomness loading the data drew."""
        seed_everything(self.seed, self.deterministic)

    def seed_process(self) -> None:
        """After the model is built (the same initial weights everywhere): each process of a
        distributed run its own dropout stream; nothing in a single process."""
        if self.dist.world_size > 1:
            torch.manual_seed(self.seed + self.dist.rank)

    def autocast(self):
        return autocast(self.device, self.precision)

    def shutdown(self) -> None:
        """Leave the processes' group (the run's last step; nothing in a single process)."""
        distributed.shutdown()


def prepare_environment(cfg) -> Environment:
    """Join the processes of ``trainer.strategy``, pick ``trainer.device`` (one per local process),
    set ``trainer.num_threads`` and seed every generator with ``seed``; first, that this machine has
    what the run asks of it (``check_hardware``)."""
    check_hardware(cfg)
    dist = distributed.setup(str(cfg.trainer.get("strategy", "none")), str(cfg.trainer.device))
    device = distributed.device_for(dist, select_device(str(cfg.trainer.device)))
    if cfg.trainer.get("num_threads"):
        torch.set_num_threads(int(cfg.trainer.num_threads))
    env = Environment(device, int(cfg.seed), bool(cfg.trainer.deterministic), str(cfg.trainer.get("precision", "32")),
                      dist)
    env.seed_everything()
    return env


def unprepared_environment(cfg) -> Environment:
    """The Environment of a run whose preparation was refused (``check_hardware``, a data-parallel
    run not launched as several processes), to record that refusal: its place among the launched
    processes (rank 0 records), nothing joined, picked or seeded."""
    return Environment(torch.device("cpu"), int(cfg.seed), bool(cfg.trainer.deterministic),
                       str(cfg.trainer.get("precision", "32")), distributed.launch_env() or distributed.SINGLE)


def check_hardware(cfg) -> None:
    """This machine has what ``cfg`` asks of the one it runs on, else one line (UserError): CUDA
    for ``trainer.device=cuda`` (device N among those visible for ``cuda:N``); CUDA for
    ``trainer.precision=fp16`` (its GradScaler; ``auto`` picks the CPU on a machine without one);
    with ``trainer.strategy=ddp`` on CUDA, a GPU for each local process (``cuda:<local rank>``:
    distributed.device_for). The only checks that depend on the machine: see the module's docstring."""
    name = str(cfg.trainer.device)
    device = select_device(name)
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise UserError(f"trainer.device={name} but this machine has {torch.cuda.device_count()} CUDA devices "
                        f"(cuda:0 to cuda:{torch.cuda.device_count() - 1})")
    if str(cfg.trainer.get("precision", "32")) == "fp16" and device.type != "cuda":
        raise UserError(f"trainer.precision=fp16 needs CUDA (autocast + GradScaler) and this machine has none "
                        f"(trainer.device={name}); run it on a GPU, or here with trainer.precision=32 or bf16")
    if str(cfg.trainer.get("strategy", "none")) != "ddp" or device.type != "cuda" or device.index is not None:
        return
    local = (distributed.launch_env() or distributed.SINGLE).local_rank
    if local >= torch.cuda.device_count():
        raise UserError(f"trainer.strategy=ddp: local process {local} takes cuda:{local}, but this node has "
                        f"{torch.cuda.device_count()} CUDA devices (one GPU per task: hydra.launcher.gpus_per_node "
                        "at least hydra.launcher.tasks_per_node)")


def check_device_name(name: str) -> None:
    """``trainer.device`` names a device (auto, cpu, cuda, cuda:N), whatever this machine has: a
    name torch cannot parse is one line, wherever the run is planned."""
    if name == "auto":
        return
    try:
        torch.device(name)
    except (RuntimeError, ValueError):
        raise unknown_choice("trainer.device", name, DEVICES) from None


def select_device(name: str = "auto") -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise UserError(f"trainer.device={name} but CUDA is not available here; use trainer.device=auto or cpu")
    return torch.device(name)


def deterministic_algorithms() -> None:
    """torch.use_deterministic_algorithms(True, warn_only=True) without its import of
    torch._inductor.config, which loads torch._dynamo (as long as `import torch` itself, per job)
    only to set the compiler's flag: nothing here compiles. The flag is set when the compiler is
    already loaded."""
    torch._C._set_deterministic_algorithms(True, warn_only=True)
    inductor = sys.modules.get("torch._inductor.config")
    if inductor is not None:
        inductor.deterministic = True


def seed_everything(seed: int, deterministic: bool = True) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(seed)
    if deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        deterministic_algorithms()
        torch.backends.cudnn.benchmark = False


def seed_worker(worker_id: int) -> None:
    """DataLoader worker init: numpy and random follow the worker's torch seed."""
    seed = torch.initial_seed() % 2**32
    np.random.seed(seed)
    random.seed(seed)


def autocast(device: torch.device, precision: str):
    """Mixed precision of ``trainer.precision``: bf16/fp16 autocast (fp16 with a GradScaler, see
    bench_cli.engine.trainer.Trainer); ``32`` does nothing. fp16 needs CUDA (``check_hardware``
    refuses it elsewhere)."""
    if str(precision) == "32":
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=torch.bfloat16 if str(precision) == "bf16" else torch.float16)
