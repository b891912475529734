"""The measurement harness of `attnbench profile`: one side (the model or the baseline) at one
point, under a time budget and a memory budget, with every failure recorded instead of raised;
and the parameters and FLOPs of a single attention layer.

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
from typing import Any, Callable, Iterator

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
    available = _proc_bytes("/proc/meminfo", "MemAvailable")
    return int(0.8 * available) if available else None


def _proc_bytes(path: str, field_name: str) -> int | None:
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
        measure_model(side.module, side.inputs, side.loss_fn, batch_size, flops=flops, memory=memory,
                        budget_bytes=budget_bytes, into=side.metrics)
    finally:
        side.metrics.pop("attn_params", None)  # a profile row has the per-layer count


# =========================================================================== timing


def train_step(side: Side) -> None:
    """Forward + loss + backward (train mode), gradients cleared first; then the side's optimiser
    step when it has one (``profile.timing.optimizer``), as a training loop's step."""
    import torch

    from bench_cli.engine.counting import call_model

    side.module.train()
    for p in side.module.parameters():
        p.grad = None
    with torch.enable_grad():
        side.loss_fn(call_model(side.module, side.inputs)).backward()
    if side.optimizer is not None:
        side.optimizer.step()


def infer_step(side: Side) -> None:
    """One forward pass in eval mode without autograd."""
    import torch

    from bench_cli.engine.counting import call_model

    side.module.eval()
    with torch.no_grad():
        call_model(side.module, side.inputs)


def _reset_peak_rss() -> bool:
    """Reset the kernel's peak-RSS mark of this process to its current RSS (Linux >= 4.0)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def time_sides(sides: list[Side], warmup: int, repeats: int, device, timeout_s, eval_batches_per_1k: int = 0,
               budget_s: float = 0.0) -> None:
    """Warm-up steps of each side (the first one also gives ``rss_train_bytes`` on Linux), then
    rounds in which every side runs one timed train step and one timed inference step, the order
    reversed from round to round: at least ``repeats`` rounds, more until the times and their
    ratios are precise or ``budget_s`` is spent (bench_cli.engine.timing.time_rounds). Each side keeps
    the seconds of every round in ``side.rounds`` (ratios are taken round by round) and reports
    medians with their quartiles; ``time_per_1k_steps_s`` = 1000 train steps plus
    ``eval_batches_per_1k`` inference batches (the evaluations a training script makes meanwhile)."""
    import gc

    from bench_cli.engine.timing import Spread, seconds, time_rounds

    for side in sides:
        def warm(side=side):
            for i in range(warmup):
                gc.collect()
                before = _proc_bytes("/proc/self/status", "VmRSS") if i == 0 and _reset_peak_rss() else None
                train_step(side)
                if before is not None:
                    peak = _proc_bytes("/proc/self/status", "VmHWM")
                    side.metrics["rss_train_bytes"] = max(0, peak - before) if peak is not None else None
                infer_step(side)
        guarded(side, "warm-up", warm, timeout_s)
    steps = [lambda side=side, step=step: guarded(side, "timing", lambda: seconds(lambda: step(side), device), timeout_s)
             for side in sides for step in (train_step, infer_step)]
    times = time_rounds(steps, min_rounds=repeats, budget_s=budget_s, warmup=0)
    for i, side in enumerate(sides):
        train, infer = times[2 * i], times[2 * i + 1]
        side.rounds = {"time_train_s": train, "time_infer_s": infer,
                       "time_per_1k_steps_s": [1000 * a + eval_batches_per_1k * b for a, b in zip(train, infer)]}
        if side.ok and train and infer:
            for key, values in side.rounds.items():
                spread = Spread.of(values)
                side.metrics.update(spread.columns(key, digits=9))
        side.module.zero_grad(set_to_none=True)


# =========================================================================== one attention layer


def profile_layer(attention: str, batch: int, seq_len: int, d_model: int, heads: int, *, meta: bool = True,
                  backend: str = "auto", **options) -> dict:
    """Parameters and FLOPs (whole batch) of one attention layer on a (batch, seq_len, d_model)
    input that requires grad; the training step's loss is the sum of the output."""
    import torch

    from bench_cli.engine import counting
    from models.attention import build_attention

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
