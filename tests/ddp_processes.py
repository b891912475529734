"""The processes of a distributed run for the tests: each sets the variables torchrun sets (RANK,
WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT) and calls the CLI's ``main``, as `attnbench run`
under torchrun does. They are forked from a forkserver that has imported the run's modules once
(torch, Hydra, the engine: about 5 s of a fresh torchrun process on 2 cores), so they start at once.
Not forked from the test's own process: after a test there has trained with two intra-op threads,
GNU OpenMP's thread pool does not survive a fork and the child hangs in its first parallel region.
"""
from __future__ import annotations

import multiprocessing
import os
import signal
import socket
import sys
from pathlib import Path


# What the forkserver imports once, before it forks the processes of every run of the test process
# (torch._dynamo: every optimiser step of torch 2.13 imports it, 2 s of a process's first step).
PRELOADED = ["torch", "torch._dynamo", "bench_cli.commands.cli", "bench_cli.engine.runner", "bench_cli.engine.trainer",
             "ddp_processes"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def as_one_process(monkeypatch) -> None:
    """The variables torchrun sets, for a process group of one in the test's own process."""
    for k, v in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
                 "MASTER_PORT": str(free_port())}.items():
        monkeypatch.setenv(k, v)


def in_the_tests_place(log: str, environment: dict, folder: str) -> None:
    """A forked process in the environment and working folder of the test that started it (the
    forkserver keeps those of the test that started the server), its output (stdout and stderr)
    into ``log``. The folders of the environment's PYTHONPATH are on sys.path after the first entry,
    where an exec'd interpreter puts them (a plugin's folder, as a user's PYTHONPATH names it)."""
    os.environ.clear()
    os.environ.update(environment)
    os.chdir(folder)
    given = [entry for entry in environment.get("PYTHONPATH", "").split(os.pathsep) if entry and entry not in sys.path]
    sys.path[1:1] = given
    with open(log, "w") as f:
        os.dup2(f.fileno(), 1)
        os.dup2(f.fileno(), 2)
    sys.stdout, sys.stderr = open(1, "w", closefd=False), open(2, "w", closefd=False)


def rank_main(rank: int, world: int, port: int, args: list[str], signal_at: tuple | None, log: str,
              environment: dict, folder: str) -> None:
    """One process of the run, in the test's environment and working folder (the forkserver has
    those of the test that started it). ``signal_at`` = (rank, step, signal name): that signal to
    this process after that optimiser step, when it is this rank (a real signal, through the run's
    handlers)."""
    in_the_tests_place(log, environment, folder)  # this rank's output in log, for the test's message
    from bench_cli.commands.cli import main
    from bench_cli.engine.trainer import _Loop

    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    if signal_at is not None and signal_at[0] == rank:
        original, (_, step, how) = _Loop.optimiser_step, signal_at

        def step_then_signal(self):
            original(self)
            if self.step == step:
                signal.raise_signal(getattr(signal, how))

        _Loop.optimiser_step = step_then_signal
    main(["run", *args])


def preloaded_forkserver():
    """The forkserver context, its server started with PRELOADED imported. A process has one
    forkserver, which keeps the preload of whatever started it: after the ListOps generator's (it
    preloads only itself: tasks/lra/listops_generator.py) each rank imported torch, Hydra and the
    engine again, 5 s a rank. Such a server is stopped first, with the method CPython's own tests
    stop it with (Lib/multiprocessing/forkserver.py ``ForkServer._stop``); a new one starts at the
    next process."""
    from multiprocessing import forkserver

    fork = multiprocessing.get_context("forkserver")
    server = forkserver._forkserver
    if server._forkserver_pid is not None and server._preload_modules != PRELOADED:
        server._stop()
    fork.set_forkserver_preload(PRELOADED)
    return fork


def run_ranks(workdir: Path, args: list[str], signal_at: tuple | None = None, world: int = 2,
              timeout: float = 60) -> tuple[list[int], str]:
    """The exit statuses of the ``world`` processes of one distributed run, and their output. A
    process still running after ``timeout`` seconds fails the test (the processes did not stop
    together: one waits in a collective for another that has gone)."""
    import torch.distributed as dist

    assert not dist.is_initialized()  # a forked process would inherit the group
    fork = preloaded_forkserver()
    port = free_port()
    logs = [str(Path(workdir) / f"rank{r}.log") for r in range(world)]
    procs = [fork.Process(target=rank_main, args=(r, world, port, args, signal_at, logs[r], dict(os.environ), os.getcwd()))
             for r in range(world)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=timeout)
    hung = [p for p in procs if p.exitcode is None]
    for p in hung:
        p.kill()
        p.join()
    output = "\n".join(f"--- rank {r}\n" + Path(log).read_text()[-3000:] for r, log in enumerate(logs))
    assert not hung, f"a process never ended (the processes did not stop together):\n{output}"
    return [p.exitcode for p in procs], output
