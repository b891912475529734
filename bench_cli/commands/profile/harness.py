"""The measurement harness of `attnbench profile`: one side (the model, the baseline or the fused
baseline) at one point, under a time budget and a memory budget, with every failure recorded
instead of raised; and the parameters and FLOPs of a single attention layer. Its timed steps are
bench_cli/commands/profile/steps.py.

A side whose tracked training peak exceeds the memory budget is ``oom`` without running; an
out-of-memory error is ``oom``; a side past its seconds is ``timeout``; any other error is
``failed``. What was measured before is kept.
"""
from __future__ import annotations

import contextlib
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from collections.abc import Callable, Iterator

from bench_cli.engine.counting import PredictedOOM, is_oom  # noqa: F401  (PredictedOOM: raised by the one measurement path)


class PointTimeout(Exception):
    """A side of a point used up its ``profile.timeout_s``."""


# =========================================================================== budgets


def memory_budget_bytes(setting, device) -> int | None:
    """``profile.memory_budget_gb`` in bytes: auto = 80% of the available RAM on the CPU, none on a GPU."""
    if setting is None:
        return None
    if setting != "auto":
        return int(float(setting) * 2**30)
    if getattr(device, "type", "cpu") == "cuda":
        return None  # the CUDA allocator raises a catchable OutOfMemoryError
    available = proc_bytes("/proc/meminfo", "MemAvailable")
    return int(0.8 * available) if available else None


def proc_bytes(path: str, field_name: str) -> int | None:
    """A ``Name:  N kB`` field of a Linux /proc file in bytes (None elsewhere)."""
    try:
        for line in Path(path).read_text().splitlines():
            if line.startswith(field_name + ":"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


class Budget:
    """Seconds a side may spend on one point. ``running()`` raises PointTimeout when they run out:
    by SIGALRM in the main thread (between Python-level ops: a long kernel finishes first),
    otherwise when the block ends."""

    def __init__(self, seconds: float | None):
        self.left = None if seconds is None else float(seconds)

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        if self.left is None:
            yield
            return
        if self.left <= 0:
            raise PointTimeout()
        alarm = hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()
        start = time.perf_counter()
        previous = None
        if alarm:
            def _expired(signum, frame):
                raise PointTimeout()

            previous = signal.signal(signal.SIGALRM, _expired)
            signal.setitimer(signal.ITIMER_REAL, self.left)
        try:
            yield
        finally:
            if alarm:
                signal.setitimer(signal.ITIMER_REAL, 0)
                signal.signal(signal.SIGALRM, previous)
            self.left -= time.perf_counter() - start
        if self.left < 0:
            raise PointTimeout()


# =========================================================================== one side


def sdpa_backend(name: str):
    """Context restricting F.scaled_dot_product_attention to one backend (``auto``: torch decides)."""
    if name == "auto":
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backend = {"math": SDPBackend.MATH, "flash": SDPBackend.FLASH_ATTENTION,
               "efficient": SDPBackend.EFFICIENT_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}[name]
    return sdpa_kernel([backend])


@dataclass
class Side:
    """The model or the baseline at one point, and what was measured of it."""

    role: str
    model_cfg: Any
    budget: Budget
    module: Any = None
    inputs: Any = None
    loss_fn: Callable | None = None
    optimizer: Any = None          # stepped by train_step when profile.timing.optimizer (the run's optimiser)
    scheduler: Any = None          # its lr scheduler, stepped after it when profile.timing.scheduler
    scaler: Any = None             # the trainer's GradScaler (enabled for trainer.precision=fp16)
    device: Any = None
    precision: str = "32"          # trainer.precision: the autocast of the forward and the loss
    backend: str = "auto"          # the SDPA backends the side runs under (the point's; auto for the fused side)
    kernels: dict = field(default_factory=dict)  # which SDPA kernels its warm-up steps ran (train, infer)
    step_peaks: list = field(default_factory=list)  # CUDA: allocator peak above the step's start, per timed step
    metrics: dict = field(default_factory=dict)
    rounds: dict = field(default_factory=dict)  # seconds of each timing round per timed metric (time_sides)
    status: str = "ok"
    error: str = ""

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def fail(self, status: str, message: str) -> None:
        if self.ok:
            self.status, self.error = status, message.splitlines()[0][:300] if message else status


def guarded(side: Side, stage: str, fn: Callable[[], Any], timeout_s: float | None = None) -> Any:
    """Run one measurement of a side; on error record oom / timeout / failed and return None."""
    if not side.ok:
        return None
    try:
        with side.budget.running():
            return fn()
    except PointTimeout:
        side.fail("timeout", f"{stage}: exceeded profile.timeout_s={timeout_s}")
    except Exception as e:  # noqa: BLE001 - recorded, and the grid goes on
        if is_oom(e):
            side.fail("oom", f"{stage}: {e}" if isinstance(e, PredictedOOM) else f"{stage}: {type(e).__name__}: {e}")
        else:
            side.fail("failed", f"{stage}: {type(e).__name__}: {e}")
    return None


def measure_static(side: Side, batch_size: int, flops: str, memory: str, device, budget_bytes: int | None) -> None:
    """Parameters, FLOPs (per sample) and peak memory (per batch) of a built side: the run's own
    measurement path (bench_cli.engine.counting.measure_model) on the side's objective."""
    from bench_cli.engine.counting import measure_model

    try:
        with sdpa_backend(side.backend):
            measure_model(side.module, side.inputs, side.loss_fn, batch_size, flops=flops, memory=memory,
                          budget_bytes=budget_bytes, precision=side.precision, into=side.metrics)
    finally:
        side.metrics.pop("attn_params", None)  # a profile row has the per-layer count


# =========================================================================== one attention layer


def profile_layer(attention: str, batch: int, seq_len: int, d_model: int, heads: int, *, meta: bool = True,
                  backend: str = "auto", **options) -> dict:
    """Parameters and FLOPs (whole batch) of one attention layer on a (batch, seq_len, d_model)
    input that requires grad; the training step's loss is the sum of the output."""
    import torch

    from bench_cli.engine import counting
    from attnbench.models.attention import build_attention

    if attention == "super" and "max_len" not in options:
        options["max_len"] = seq_len
    layer = build_attention(attention, d_model=d_model, n_heads=heads, **options)
    x = torch.zeros(batch, seq_len, d_model, requires_grad=True)  # fake copies are made when meta
    inputs = {"x": x}
    with sdpa_backend(backend):
        return {
            "params": counting.count_parameters(layer),
            "flops_forward": counting.flops_forward(layer, inputs, meta=meta),
            "flops_train_step": counting.flops_train_step(layer, inputs, lambda out: out.sum(), meta=meta),
        }
