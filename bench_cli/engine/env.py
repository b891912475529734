"""The environment of one run, prepared before anything is built: the processes (``trainer.strategy``,
bench_cli/engine/distributed.py), the device, the intra-op threads, the seeds and the precision.

``prepare_environment(cfg)`` does it once, first; the ``Environment`` it returns is what the rest of
the run reads (the device, ``autocast()`` for ``trainer.precision``, the process's rank) instead of
the config. The helpers below it are also what the commands that build a model outside a run
(evaluate, profile, smoke, bench-overhead) use, so every path picks and seeds the same way.
"""
from __future__ import annotations

import contextlib
import os
import random
import sys
from dataclasses import dataclass

import numpy as np
import torch

from bench_cli.core.errors import UserError
from bench_cli.engine import distributed as D

PRECISIONS = ("32", "bf16", "fp16")


@dataclass(frozen=True)
class Environment:
    """Where and how this process runs: its device, the run's seed (``deterministic``: torch's
    deterministic algorithms), ``trainer.precision`` and its place among the processes."""

    device: torch.device
    seed: int
    deterministic: bool
    precision: str
    dist: D.DistEnv = D.SINGLE

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
        D.shutdown()


def prepare_environment(cfg) -> Environment:
    """Join the processes of ``trainer.strategy``, pick ``trainer.device`` (one per local process),
    set ``trainer.num_threads`` and seed every generator with ``seed``."""
    dist = D.setup(str(cfg.trainer.get("strategy", "none")), str(cfg.trainer.device))
    device = D.device_for(dist, select_device(str(cfg.trainer.device)))
    if cfg.trainer.get("num_threads"):
        torch.set_num_threads(int(cfg.trainer.num_threads))
    env = Environment(device, int(cfg.seed), bool(cfg.trainer.deterministic), str(cfg.trainer.get("precision", "32")),
                      dist)
    env.seed_everything()
    return env


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
    bench_cli.engine.trainer.Trainer); ``32`` does nothing. fp16 needs CUDA (bench_cli.commands.validate
    refuses it on the CPU)."""
    if str(precision) == "32":
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=torch.bfloat16 if str(precision) == "bf16" else torch.float16)
