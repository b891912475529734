"""The timed steps of `attnbench profile`: one training step and one inference step of a side as
a training loop runs them, and the rounds that time every side's steps, alternating.

A training step is the trainer's (bench_cli.engine.trainer): the forward and the objective under
``trainer.precision``'s autocast (bench_cli.engine.env.autocast), the backward of the loss scaled
by the trainer's GradScaler (enabled for fp16), then, with ``profile.timing.optimizer``, the
optimiser step through the scaler and, with ``profile.timing.scheduler``, the lr scheduler's step;
gradients are freed after it (``zero_grad(set_to_none=True)``, as the trainer does). That is the
step the Primal-Attention authors time (run_tasks_time_memory.py, lines 91-120: AMP forward,
``amp_scaler.scale(loss).backward()``, ``amp_scaler.step(optimizer)``, ``lr_scheduler.step()``).
"""
from __future__ import annotations

from bench_cli.commands.profile.harness import Side, guarded, proc_bytes, sdpa_backend


def train_step(side: Side) -> None:
    """One training step of ``side`` (see the module's docstring)."""
    import torch

    from bench_cli.engine.counting import call_model
    from bench_cli.engine.env import autocast

    side.module.train()
    with sdpa_backend(side.backend), torch.enable_grad():
        with autocast(side.device, side.precision):
            loss = side.loss_fn(call_model(side.module, side.inputs))
        (side.scaler.scale(loss) if side.scaler is not None else loss).backward()
    if side.optimizer is not None:
        if side.scaler is not None:
            side.scaler.step(side.optimizer)
            side.scaler.update()
        else:
            side.optimizer.step()
        scheduler = side.scheduler
        last = getattr(scheduler, "total_steps", None)  # OneCycleLR raises past its last step
        if scheduler is not None and (last is None or scheduler.last_epoch + 1 < last):
            scheduler.step()
    side.module.zero_grad(set_to_none=True)


def infer_step(side: Side) -> None:
    """One forward pass in eval mode without autograd, under the side's precision."""
    import torch

    from bench_cli.engine.counting import call_model
    from bench_cli.engine.env import autocast

    side.module.eval()
    with sdpa_backend(side.backend), torch.no_grad(), autocast(side.device, side.precision):
        call_model(side.module, side.inputs)


def _reset_peak_rss() -> bool:
    """Reset the kernel's peak-RSS mark of this process to its current RSS (Linux >= 4.0)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _warm_up(side: Side, warmup: int) -> None:
    """Untimed steps; the first gives ``rss_train_bytes`` (Linux) and which SDPA kernels ran."""
    import gc

    from bench_cli.engine.sdpa_kernels import SdpaKernels

    for i in range(warmup):
        gc.collect()
        before = proc_bytes("/proc/self/status", "VmRSS") if i == 0 and _reset_peak_rss() else None
        with SdpaKernels() as train_kernels:
            train_step(side)
        if before is not None:
            peak = proc_bytes("/proc/self/status", "VmHWM")
            side.metrics["rss_train_bytes"] = max(0, peak - before) if peak is not None else None
        with SdpaKernels() as infer_kernels:
            infer_step(side)
        if i == 0:
            side.kernels = {"train": train_kernels.ran, "infer": infer_kernels.ran}


def _timed(side: Side, step, device, steps: int, track_peak: bool) -> float:
    """Seconds per step of ``steps`` consecutive ``step(side)`` (one timed region); on CUDA with
    ``track_peak``, the allocator's peak above the region's start is kept in ``side.step_peaks``."""
    import torch

    from bench_cli.engine.timing import seconds

    if track_peak:
        torch.cuda.reset_peak_memory_stats(device)
        start = torch.cuda.memory_allocated(device)

    def run():
        for _ in range(steps):
            step(side)
    took = seconds(run, device) / steps
    if track_peak:
        side.step_peaks.append(torch.cuda.max_memory_allocated(device) - start)
    return took


def _allocator_peak(side: Side) -> int:
    """The side's training peak over its timed steps: the highest step peak plus what the side
    holds between steps (parameters, buffers, optimiser and scaler state, inputs), as
    torch.cuda.max_memory_allocated counts them in a process that trains this model alone."""
    import torch
    from torch.utils._pytree import tree_flatten

    from bench_cli.engine.counting import storage_bytes

    held = [*side.module.parameters(), *side.module.buffers()]
    if side.optimizer is not None:
        held += [t for state in side.optimizer.state.values() for t in state.values() if torch.is_tensor(t)]
    held += [t for t in tree_flatten(side.inputs)[0] if torch.is_tensor(t)]
    return max(side.step_peaks) + storage_bytes(held, side.device)


def time_sides(sides: list[Side], timing, device, timeout_s, peak_over_timed_steps: bool = False) -> None:
    """Warm-up steps of each side, then rounds in which every side runs its timed train steps and
    one timed inference step, the order reversed from round to round: at least
    ``timing.repeats`` rounds, more until the times and their ratios are precise or
    ``timing.budget_s`` is spent (bench_cli.engine.timing.time_rounds). A round times
    ``timing.steps_per_round`` consecutive training steps (their mean). Each side keeps the seconds
    of every round in ``side.rounds`` (ratios are taken round by round) and reports medians with
    their quartiles; ``time_per_1k_steps_s`` = 1000 train steps plus
    ``timing.eval_batches_per_1k_steps`` inference batches (the evaluations a training script
    makes meanwhile). ``peak_over_timed_steps`` (CUDA): ``peak_mem_train_bytes`` becomes the
    allocator's peak over the timed steps (``_allocator_peak``)."""
    from bench_cli.engine.timing import Spread, time_rounds

    track_peak = peak_over_timed_steps and device.type == "cuda"
    steps_per_round = int(timing.get("steps_per_round") or 1)
    eval_batches = int(timing.get("eval_batches_per_1k_steps") or 0)
    for side in sides:
        guarded(side, "warm-up", lambda side=side: _warm_up(side, int(timing.warmup)), timeout_s)
    steps = []
    for side in sides:
        steps += [lambda side=side: guarded(side, "timing", lambda: _timed(side, train_step, device, steps_per_round,
                                                                             track_peak), timeout_s),
                  lambda side=side: guarded(side, "timing", lambda: _timed(side, infer_step, device, 1, False),
                                            timeout_s)]
    times = time_rounds(steps, min_rounds=int(timing.repeats), budget_s=float(timing.get("budget_s") or 0), warmup=0)
    for i, side in enumerate(sides):
        train, infer = times[2 * i], times[2 * i + 1]
        side.rounds = {"time_train_s": train, "time_infer_s": infer,
                       "time_per_1k_steps_s": [1000 * a + eval_batches * b for a, b in zip(train, infer)]}
        if side.ok and train and infer:
            for key, values in side.rounds.items():
                side.metrics.update(Spread.of(values).columns(key, digits=9))
            side.metrics["timed_train_steps"] = len(train) * steps_per_round
        if side.ok and side.step_peaks:
            side.metrics["peak_mem_train_bytes"] = _allocator_peak(side)
            side.metrics["memory_method"] = ("CUDA allocator peak over the timed steps (max_memory_allocated; "
                                             "parameters, optimiser state and inputs included)")
