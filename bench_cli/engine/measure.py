"""Measurements of a model: parameters, counted FLOPs and peak memory; at the end, a run's
measurement (``measure_run``) with its cache (``MeasureCache``) and its inference time.

Everything is device-agnostic: the device is the one of the model's parameters (or, for a
parameter-free model, of the inputs). ``inputs`` is what the model is called with: a dict of
keyword arguments (``model(**inputs)``), a tuple/list of positional arguments
(``model(*inputs)``) or a single tensor (``model(inputs)``).

FLOPs
    Counted, not estimated, with :class:`torch.utils.flop_counter.FlopCounterMode`: every
    matmul-like ATen op that actually runs contributes ``2 * MACs`` (bias adds, softmax,
    norms and other element-wise work are not counted, so ``addmm`` counts as its ``mm``).
    PyTorch ships formulas for the CUDA SDPA kernels only; the CPU flash kernel (and the
    XPU/HPU "overrideable" and MPS kernels) count zero unless :func:`ensure_sdpa_formulas`
    registered them, which importing this module does. They use PyTorch's own convention so
    CPU and GPU counts agree: forward ``4*B*H*Nq*Nk*d`` (QK^T and AV; causal/padding masks do
    not reduce it), backward ``10*B*H*Nq*Nk*d`` (five matmuls: the scores are recomputed).
    When SDPA falls back to its math path (dropout > 0 on the CPU) the matmuls are counted
    as plain ``bmm``: same forward, but a backward of 4 matmuls (the scores are stored).

    ``meta=True`` runs the model on *fake* tensors (``FakeTensorMode``: meta storage, so no
    data, no compute, any size) that still report the model's device, so SDPA picks the same
    kernel as a real run and the counts are identical. Parameters and buffers are swapped in
    with ``torch.func.functional_call``; the model itself is left untouched. Code that needs
    tensor *values* (``.item()``, boolean indexing, ``nonzero``) cannot run on fake tensors:
    :class:`MetaCountingError` is raised and the caller may measure on the real device.

Peak memory (bytes)
    Same definition on every device: the persistent state the step uses (parameters, buffers
    and the tensor inputs) plus everything the step allocates that is alive at its worst
    moment (activations, autograd saved tensors, temporaries, gradients, the output).
    Gradients that existed before are stashed and not counted (see below).

    * CUDA: ``torch.cuda.max_memory_allocated`` of the step above the memory allocated just
      before it, plus the state bytes (each storage rounded to the allocator's 512-byte
      blocks). This is what the caching allocator handed out, including kernel workspaces;
      tensors of other objects on the GPU (optimizer states, other models) are excluded.
    * CPU and any other device, and ``meta=True``: ``MemTracker``
      (``torch.distributed._tools.mem_tracker``), a dispatch mode that records the untyped
      storage of every tensor an ATen op returns and drops it when the storage is freed
      (weakref), keeping the running maximum of the live bytes after each op. It is
      deterministic (the garbage collector is paused during the step) and exact for
      storages seen at the dispatcher, but scratch buffers a kernel allocates and frees
      internally (e.g. the blocks of the CPU flash-attention kernel) are invisible to it.
      On the CPU it counts ``numel * element_size`` bytes, with no allocator rounding.
      Tensors the model or ``loss_fn`` capture from outside (e.g. targets in a closure) are
      counted from their first use; with ``meta=True`` their fake copies can die as soon as
      autograd releases them, so the fake peak may be lower by at most their size.

Measuring never disturbs training: module train/eval flags, existing ``.grad`` s (set to None
during the step and put back afterwards), buffers (e.g. BatchNorm running stats) and the RNG
state are all restored.
"""
from __future__ import annotations

import contextlib
import gc
import json
import math
import os
import resource
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import torch
import torch.nn as nn
from torch.utils import flop_counter
from torch.utils._pytree import tree_flatten, tree_map_only
from torch.utils._python_dispatch import TorchDispatchMode

from bench_cli.core.errors import is_oom, warn_once
from bench_cli.core.files import write_atomically
from bench_cli.core.spread import NOISY_NOTE, NOISY_SPREAD, Spread, ratio_spread

__all__ = [
    "Conditions",
    "MeasureCache",
    "Spread",
    "ratio_spread",
    "seconds",
    "time_rounds",
    "timed",
    "MetaCountingError",
    "ValueReads",
    "attention_parameters",
    "count_parameters",
    "ensure_sdpa_formulas",
    "flops_forward",
    "flops_train_step",
    "is_attention_module",
    "example_batch",
    "inference_time",
    "is_oom",
    "measure_model",
    "measure_run",
    "peak_memory_inference",
    "peak_memory_train_step",
    "per_sample",
    "process_peak_rss_bytes",
]

Inputs = Any  # dict of keyword args | tuple/list of positional args | a single tensor
LossFn = Callable[[Any], torch.Tensor]


class MetaCountingError(RuntimeError):
    """The model cannot run on fake (meta) tensors; measure on the real device instead."""


# --------------------------------------------------------------------------- parameters


def count_parameters(model: nn.Module) -> int:
    """Number of parameter elements, trainable or not (buffers excluded, shared ones once)."""
    return sum(p.numel() for p in model.parameters())


def is_attention_module(m: nn.Module) -> bool:
    """True for the registry's attentions: classes defined in the ``models.attention`` package, and
    a plugin's attentions (subclasses of its AttentionBase)."""
    from models.attention.base import AttentionBase

    mod = getattr(type(m), "__module__", "")
    return mod == "models.attention" or mod.startswith("models.attention.") or isinstance(m, AttentionBase)


def attention_parameters(model: nn.Module) -> dict[str, int]:
    """Parameters of the attention layers: the top-most attention modules (not ones nested in them).

    Returns ``{"attn_params", "attn_layers", "attn_params_per_layer"}``; a layer used twice counts once.
    """
    layers: list[nn.Module] = []
    inside: set[int] = set()
    for m in model.modules():  # pre-order: parents come before their children
        if id(m) in inside or not is_attention_module(m):
            continue
        layers.append(m)
        inside.update(id(sub) for sub in m.modules())
    seen: set[int] = set()
    total = 0
    for layer in layers:
        for p in layer.parameters():
            if id(p) not in seen:
                seen.add(id(p))
                total += p.numel()
    n = len(layers)
    return {"attn_params": total, "attn_layers": n, "attn_params_per_layer": total // n if n else 0}


# --------------------------------------------------------------------------- SDPA FLOP formulas

# Fused SDPA kernels that torch.utils.flop_counter has no formula for (torch 2.13): the CPU flash
# kernel that F.scaled_dot_product_attention uses on the CPU (any mask, causal, no dropout), the
# "overrideable" kernel of out-of-tree backends (XPU, HPU, PrivateUse1) and the MPS kernel. Each
# forward takes (query, key, value, ...) and each backward (grad_out, query, key, value, ...), the
# argument order torch's sdpa_flop / sdpa_backward_flop expect.
_SDPA_FORWARD_OPS = (
    "_scaled_dot_product_flash_attention_for_cpu",
    "_scaled_dot_product_fused_attention_overrideable",
    "_scaled_dot_product_attention_math_for_mps",
)
_SDPA_BACKWARD_OPS = (
    "_scaled_dot_product_flash_attention_for_cpu_backward",
    "_scaled_dot_product_fused_attention_overrideable_backward",
)


def ensure_sdpa_formulas() -> list[str]:
    """Register torch's SDPA FLOP formulas for the fused kernels that lack one. Idempotent.

    Returns the names of the ops registered by this call (empty when already done, or when a
    future torch ships its own formula, which is then kept).
    """
    registered = []
    for names, formula in ((_SDPA_FORWARD_OPS, flop_counter.sdpa_flop),
                           (_SDPA_BACKWARD_OPS, flop_counter.sdpa_backward_flop)):
        for name in names:
            op = getattr(torch.ops.aten, name, None)
            if op is None or op in flop_counter.flop_registry:
                continue
            # sdpa_flop / sdpa_backward_flop are already shape-wrapped: register them raw.
            flop_counter.register_flop_formula(op, get_raw=True)(formula)
            registered.append(name)
    return registered


ensure_sdpa_formulas()


# --------------------------------------------------------------------------- running the model


def _call(model: nn.Module, inputs: Inputs):
    if isinstance(inputs, dict):
        return model(**inputs)
    if isinstance(inputs, (tuple, list)):
        return model(*inputs)
    return model(inputs)


def _tensors(tree: Any) -> list[torch.Tensor]:
    return [t for t in tree_flatten(tree)[0] if isinstance(t, torch.Tensor)]


def _device(model: nn.Module, inputs: Inputs, *, skip_meta: bool = False) -> torch.device:
    """The model's device (first parameter or buffer), else the first input tensor's, else the CPU."""
    for t in (*model.parameters(), *model.buffers(), *_tensors(inputs)):
        if not (skip_meta and t.device.type == "meta"):
            return t.device
    return torch.device("cpu")


def _fork_rng(device: torch.device):
    if device.type in ("cpu", "meta"):
        return torch.random.fork_rng(devices=[])
    index = device.index if device.index is not None else torch.accelerator.current_device_index()
    return torch.random.fork_rng(devices=[index], device_type=device.type)


@contextlib.contextmanager
def _undisturbed(model: nn.Module, train: bool, device: torch.device) -> Iterator[None]:
    """Put ``model`` in train/eval mode with no grads; restore flags, grads, buffers and RNG after."""
    flags = [(m, m.training) for m in model.modules()]
    params = list(model.parameters())
    grads = [p.grad for p in params]
    buffers = [(b, b.detach().clone()) for b in model.buffers()] if train else []
    try:
        for p in params:
            p.grad = None
        model.train(train)
        with _fork_rng(device):
            yield
    finally:
        for p, g in zip(params, grads):
            p.grad = g
        with torch.no_grad():
            for b, saved in buffers:
                b.copy_(saved)
        for m, flag in flags:
            m.training = flag


def _fake_like(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    # Called under FakeTensorMode: no storage is allocated.
    return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=device,
                               requires_grad=t.requires_grad)


@contextlib.contextmanager
def _runner(model: nn.Module, inputs: Inputs, *, train: bool, meta: bool):
    """Yield ``(call, state, device)``: ``call()`` runs the model once on ``inputs`` (fake
    copies when ``meta``); ``state`` are the parameters, buffers and tensor inputs it uses."""
    device = _device(model, inputs, skip_meta=meta)
    with _undisturbed(model, train, device):
        if not meta:
            state = [*model.parameters(), *model.buffers(), *_tensors(inputs)]
            yield (lambda: _call(model, inputs)), state, device
            return
        from torch._subclasses.fake_tensor import FakeTensorMode

        # allow_non_fake_inputs: plain tensor attributes of the model or of loss_fn closures
        # (e.g. targets) are converted on the fly instead of raising.
        with FakeTensorMode(allow_non_fake_inputs=True):
            named = dict(model.named_parameters())
            named.update(model.named_buffers())
            fake_state = {name: _fake_like(t, device) for name, t in named.items()}
            fake_inputs = tree_map_only(torch.Tensor, lambda t: _fake_like(t, device), inputs)

            def call():
                if isinstance(fake_inputs, dict):
                    args, kwargs = (), fake_inputs
                elif isinstance(fake_inputs, (tuple, list)):
                    args, kwargs = tuple(fake_inputs), {}
                else:
                    args, kwargs = (fake_inputs,), {}
                return torch.func.functional_call(model, fake_state, args, kwargs)

            try:
                yield call, [*fake_state.values(), *_tensors(fake_inputs)], device
            except (RuntimeError, NotImplementedError) as e:
                raise MetaCountingError(
                    f"{type(model).__name__} cannot run on fake/meta tensors "
                    f"({type(e).__name__}: {e}); measure with meta=False"
                ) from e


def _train_step(call: Callable[[], Any], loss_fn: LossFn) -> None:
    with torch.enable_grad():
        loss = loss_fn(call())
        if not (isinstance(loss, torch.Tensor) and loss.dim() == 0):
            raise ValueError(f"loss_fn must return a scalar tensor, got {type(loss).__name__} "
                             f"of shape {tuple(getattr(loss, 'shape', ()))}")
        loss.backward()


# --------------------------------------------------------------------------- FLOPs


def _count_flops(fn: Callable[[], Any]) -> int:
    with flop_counter.FlopCounterMode(display=False) as counter:
        fn()
    return counter.get_total_flops()


def flops_forward(model: nn.Module, inputs: Inputs, *, meta: bool = False) -> int:
    """FLOPs of one forward pass over the whole batch (eval mode, no_grad)."""
    with _runner(model, inputs, train=False, meta=meta) as (call, _, _dev), torch.no_grad():
        return _count_flops(call)


def flops_train_step(model: nn.Module, inputs: Inputs, loss_fn: LossFn, *, meta: bool = False) -> int:
    """FLOPs of forward + ``loss_fn(output)`` + backward over the whole batch (train mode, no optimizer step)."""
    with _runner(model, inputs, train=True, meta=meta) as (call, _, _dev):
        return _count_flops(lambda: _train_step(call, loss_fn))


def per_sample(x: int | float, batch_size: int) -> float:
    """``x / batch_size`` (per-sample value of a whole-batch measurement)."""
    if batch_size <= 0:
        raise ValueError(f"batch_size must be positive, got {batch_size}")
    return x / batch_size


# --------------------------------------------------------------------------- peak memory

_CUDA_BLOCK = 512  # the CUDA caching allocator rounds every allocation up to 512 bytes


def _storage_bytes(tensors: list[torch.Tensor], device: torch.device) -> int:
    seen, total = set(), 0
    for t in tensors:
        if t.device != device:
            continue
        st = t.untyped_storage()
        if st.data_ptr() in seen:
            continue
        seen.add(st.data_ptr())
        total += math.ceil(st.nbytes() / _CUDA_BLOCK) * _CUDA_BLOCK
    return total


def _peak_cuda(call: Callable[[], Any], state: list[torch.Tensor], device: torch.device) -> int:
    torch.cuda.synchronize(device)
    baseline = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    call()
    torch.cuda.synchronize(device)
    return torch.cuda.max_memory_allocated(device) - baseline + _storage_bytes(state, device)


def _peak_tracked(call: Callable[[], Any], state: list[torch.Tensor], device: torch.device) -> int:
    from torch.distributed._tools.mem_tracker import MemTracker

    gc.collect()
    was_enabled = gc.isenabled()
    gc.disable()  # frees happen by reference counting only: deterministic
    try:
        tracker = MemTracker()
        tracker.track_external(*state)
        with tracker:
            call()
        snapshot = tracker.get_tracker_snapshot("peak")
    finally:
        if was_enabled:
            gc.enable()
    return snapshot.get(device, {}).get("Total", 0)


def _peak(run: Callable[[], Any], state: list[torch.Tensor], device: torch.device, meta: bool) -> int:
    if device.type == "cuda" and not meta:
        return _peak_cuda(run, state, device)
    return _peak_tracked(run, state, device)


def peak_memory_train_step(model: nn.Module, inputs: Inputs, loss_fn: LossFn, *, meta: bool = False) -> int:
    """Peak bytes of forward + loss + backward (train mode) over the whole batch; see the module doc."""
    with _runner(model, inputs, train=True, meta=meta) as (call, state, device):
        return _peak(lambda: _train_step(call, loss_fn), state, device, meta)


def peak_memory_inference(model: nn.Module, inputs: Inputs, *, meta: bool = False) -> int:
    """Peak bytes of one forward pass (eval mode, no_grad) over the whole batch; see the module doc."""
    with _runner(model, inputs, train=False, meta=meta) as (call, state, device), torch.no_grad():
        return _peak(call, state, device, meta)


def process_peak_rss_bytes() -> int:
    """Peak resident set size of this process so far (everything: Python, libraries, allocator caches)."""
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss if sys.platform == "darwin" else rss * 1024  # macOS reports bytes, Linux KiB


# --------------------------------------------------------------------------- all together


# --------------------------------------------------------------------------- time
#
# One timer for every timing (bench, profile, a run's inference and epochs, bench-overhead's
# summaries): the median with its interquartile range, never one number. A ratio model / baseline
# comes from rounds in which each side runs once, the order alternating from round to round, so a
# burst of load hits both sides of a pair; its interval is the IQR of the per-round ratios.
#
# Why not torch.utils.benchmark.Timer.adaptive_autorange: it times one statement alone, block after
# block, so the baseline would be timed minutes apart from the model (its spread says nothing
# about the ratio), it cannot run under profile's per-side time budget (SIGALRM) and its clock is
# not injectable in tests. Its stopping rule is kept: repeat until IQR / median <= precision
# (after a minimum number of rounds) or until the time budget is spent.


class RegionTimer:
    """Seconds of a timed region that may span many calls (a training segment between two
    evaluations). On CUDA, which runs asynchronously, two CUDA events on the device's current
    stream: ``stop`` records the end event and waits for it, once per region, never per step;
    elsewhere wall-clock ``time.perf_counter``. ``timer_name`` says which."""

    def __init__(self, device: torch.device | None = None):
        self.device = device if device is not None and device.type == "cuda" else None

    def start(self) -> None:
        if self.device is not None:
            self._start = torch.cuda.Event(enable_timing=True)
            self._start.record(torch.cuda.current_stream(self.device))
        else:
            self._start_s = time.perf_counter()

    def stop(self) -> float:
        if self.device is None:
            return time.perf_counter() - self._start_s
        end = torch.cuda.Event(enable_timing=True)
        end.record(torch.cuda.current_stream(self.device))
        end.synchronize()
        return self._start.elapsed_time(end) / 1000.0  # milliseconds


def seconds(fn: Callable[[], Any], device: torch.device | None = None,
            clock: Callable[[], float] = time.perf_counter) -> float:
    """Seconds of ``fn()``: the one timer of a run's inference timing, `attnbench profile` and
    `make bench`. On CUDA two events around the call (a :class:`RegionTimer`), the device
    synchronised once before it so that work queued earlier does not count; elsewhere ``clock``
    (a fake one in tests)."""
    if device is not None and device.type == "cuda":
        torch.cuda.synchronize(device)
        timer = RegionTimer(device)
        timer.start()
        fn()
        return timer.stop()
    start = clock()
    fn()
    return clock() - start


def timer_name(device: torch.device | None) -> str:
    """The clock ``seconds`` reads on ``device`` (for the records)."""
    return "CUDA events" if device is not None and device.type == "cuda" else "time.perf_counter"


def time_rounds(steps: list[Callable[[], float | None]], *, min_rounds: int = 5, max_rounds: int = 200,
                precision: float = 0.05, budget_s: float = 2.0, warmup: int = 1,
                clock: Callable[[], float] = time.perf_counter) -> list[list[float]]:
    """Seconds of each of ``steps`` per round: ``warmup`` untimed calls of each, then rounds in
    which every step runs once, in order in even rounds and reversed in odd ones, until, after
    ``min_rounds``, the first step's times and every other step's ratios to it have an
    IQR / median <= ``precision``, or ``budget_s`` seconds were spent, or ``max_rounds`` ran.

    A step runs one measurement and returns its seconds (``timed(fn, device)``), or None when it
    could not run (profile's failed side): it then adds no time and is not waited for."""
    for _ in range(warmup):
        for step in steps:
            step()
    times: list[list[float]] = [[] for _ in steps]
    started = clock()
    for i in range(max_rounds):
        order = range(len(steps)) if i % 2 == 0 else reversed(range(len(steps)))
        for j in order:
            t = steps[j]()
            if t is not None:
                times[j].append(t)
        if i + 1 >= min_rounds and (clock() - started >= budget_s or _precise(times, precision)):
            break
    return times


PRECISION_MIN_N = 3  # fewer times have no spread to judge: one round's "IQR" is 0 by construction


def _precise(times: list[list[float]], precision: float) -> bool:
    live = [t for t in times if t]
    if not live:
        return True
    base = live[0]
    if len(base) < PRECISION_MIN_N:
        return False
    return Spread.of(base).relative <= precision and all(
        ratio_spread(t, base).relative <= precision for t in live[1:] if len(t) == len(base))


def timed(fn: Callable[[], Any], device: torch.device | None = None,
          clock: Callable[[], float] = time.perf_counter) -> Callable[[], float]:
    """A step for :func:`time_rounds`: runs ``fn`` once and returns its seconds."""
    return lambda: seconds(fn, device, clock)


def load_average() -> float | None:
    """The 1-minute load average (None where the OS has none)."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


@dataclass
class Conditions:
    """What the machine was doing while something was timed: the 1-minute load average before and
    after, the threads torch used and the cores. ``Conditions.now()`` at the start, ``.done()`` at the end."""

    load_before: float | None
    threads: int
    cores: int
    load_after: float | None = None
    one_thread: str = "trainer.num_threads=1"  # how the command's user asks for one thread (the noisy line says it)

    @classmethod
    def now(cls, one_thread: str = "trainer.num_threads=1") -> "Conditions":
        return cls(load_average(), torch.get_num_threads(), os.cpu_count() or 1, one_thread=one_thread)

    def done(self) -> "Conditions":
        self.load_after = load_average()
        self.threads = torch.get_num_threads()
        return self

    @property
    def overloaded(self) -> bool:
        """Load beyond the cores: before, or after once our own threads are taken out (the
        1-minute average counts them)."""
        before, after = self.load_before or 0.0, (self.load_after or 0.0) - self.threads
        return max(before, after) > self.cores

    def noise(self, spreads: list[Spread] = ()) -> str:
        """'' when the timing can be trusted, else NOISY_NOTE, what else to change, and why: with
        several threads, one thread per process (threads that wait for a descheduled one made the
        default run 6-30x slower on a shared 2-core machine: conf/trainer/default.yaml)."""
        reasons = []
        if self.overloaded:
            reasons.append(f"load {max(self.load_before or 0, self.load_after or 0):.1f} on {self.cores} cores")
        wide = [s for s in spreads if s.noisy]
        if wide:
            reasons.append(f"{len(wide)} time(s) with IQR > {NOISY_SPREAD:.0%} of the median")
        if not reasons:
            return ""
        if self.threads > 1:
            return f"{NOISY_NOTE} or with {self.one_thread} ({self.threads} threads; {'; '.join(reasons)})"
        return f"{NOISY_NOTE} ({'; '.join(reasons)})"

    def columns(self) -> dict:
        """The record's columns of the conditions (bench_cli.results.schema.TIMING_COLUMNS)."""
        r = lambda v: None if v is None else round(v, 2)  # noqa: E731
        return {"load_before": r(self.load_before), "load_after": r(self.load_after), "threads": self.threads}

    def line(self) -> str:
        f = lambda v: "-" if v is None else f"{v:.2f}"  # noqa: E731
        return (f"load average (1 min) before {f(self.load_before)}, after {f(self.load_after)}; "
                f"{self.threads} thread{'s' if self.threads != 1 else ''}, {self.cores} cores")


# --------------------------------------------------------------------------- all measurements


class PredictedOOM(MemoryError):
    """The tracked peak of a training step exceeds the memory budget (``profile.memory_budget_gb``)."""


def _counted_flops(model: nn.Module, inputs: Inputs, loss_fn: LossFn, batch_size: int, how: str) -> dict:
    """FLOPs per sample of a forward and of a training step; ``how``: real, or meta (fake
    tensors), falling back to real tensors when the model needs tensor values."""
    meta = how == "meta"
    try:
        fwd = flops_forward(model, inputs, meta=meta)
        train = flops_train_step(model, inputs, loss_fn, meta=meta)
    except MetaCountingError:
        meta = False
        fwd = flops_forward(model, inputs)
        train = flops_train_step(model, inputs, loss_fn)
    return {"flops_forward": per_sample(fwd, batch_size), "flops_train_step": per_sample(train, batch_size),
            "flops_method": "FlopCounterMode on " + ("fake tensors" if meta else "real tensors")}


def _peak_memory(model: nn.Module, inputs: Inputs, loss_fn: LossFn, how: str, device: torch.device,
                 budget_bytes: int | None) -> dict:
    """Peak memory of a training step and of inference. ``how``: real, fake (tracked on fake
    tensors), auto (fake unless on CUDA) or off; with ``budget_bytes``, a training step whose
    tracked peak exceeds it raises PredictedOOM before anything real runs."""
    out: dict = {}
    fake = how in ("fake", "off") or (how == "auto" and device.type != "cuda")
    if fake or budget_bytes is not None:
        try:
            train_peak = peak_memory_train_step(model, inputs, loss_fn, meta=True)
            infer_peak = peak_memory_inference(model, inputs, meta=True)
        except MetaCountingError:
            if budget_bytes is not None and device.type != "cuda":
                raise PredictedOOM("cannot estimate the peak on fake tensors, so it is not run under "
                                   "profile.memory_budget_gb; set profile.memory_budget_gb=null to run it anyway") from None
            train_peak = infer_peak = None
            fake = False
        if budget_bytes is not None and train_peak is not None and train_peak > budget_bytes:
            raise PredictedOOM(f"tracked training peak {train_peak / 2**30:.2f} GiB > profile.memory_budget_gb="
                               f"{budget_bytes / 2**30:.2f} GiB (not run)")
        if fake and how != "off":
            out.update(peak_mem_train_bytes=train_peak, peak_mem_infer_bytes=infer_peak,
                       memory_method=f"MemTracker on fake tensors ({device.type})")
    if how != "off" and not fake:
        out.update(peak_mem_train_bytes=peak_memory_train_step(model, inputs, loss_fn),
                   peak_mem_infer_bytes=peak_memory_inference(model, inputs),
                   memory_method=("CUDA allocator peak" if device.type == "cuda"
                                  else f"MemTracker on real tensors ({device.type})"))
        if device.type == "cuda":  # the allocator's peak, and beside it the estimate a CPU run would record
            out.update(cuda_memory_columns(model, inputs, loss_fn))
    return out


def cuda_memory_columns(model: nn.Module, inputs: Inputs, loss_fn: LossFn) -> dict:
    """What a CUDA measurement records beside ``peak_mem_*_bytes`` (there the allocator's peak,
    ``torch.cuda.max_memory_allocated``): which method gave them, and the MemTracker estimate on
    fake tensors (what the CPU records; None when the model reads tensor values)."""
    try:
        train, infer = (peak_memory_train_step(model, inputs, loss_fn, meta=True),
                        peak_memory_inference(model, inputs, meta=True))
    except MetaCountingError:
        train = infer = None
    return {"peak_mem_source": "torch.cuda.max_memory_allocated", "peak_mem_train_estimate_bytes": train,
            "peak_mem_infer_estimate_bytes": infer}


class ValueReads(TorchDispatchMode):
    """Notes whether the ops run under it read tensor values on the host (``.item()``, ``bool()``,
    ``float()``, ``torch.equal``) or made shapes from values (``nonzero``, ``masked_select``,
    ``unique``, indexing with a boolean mask). A model that did neither ran the same ops on the
    same shapes whatever its weights and data values: its FLOPs and peak memory depend on the
    shapes alone, so they can be reused (MeasureCache, below)."""

    VALUE_OPS = frozenset({"_local_scalar_dense", "is_nonzero", "equal", "nonzero", "nonzero_static", "argwhere",
                           "masked_select", "unique", "_unique", "_unique2", "unique_dim", "unique_consecutive"})

    def __init__(self):
        super().__init__()
        self.seen: set[str] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name in self.VALUE_OPS or (name.startswith("index") and any(
                isinstance(t, torch.Tensor) and t.dtype == torch.bool for t in tree_flatten((args, kwargs))[0])):
            self.seen.add(name)
        return func(*args, **(kwargs or {}))


def measure_model(model: nn.Module, inputs: Inputs, loss_fn: LossFn, batch_size: int, *, flops: str = "real",
                  memory: str = "real", budget_bytes: int | None = None,
                  into: dict | None = None) -> dict[str, int | float | str]:
    """The one measurement path (a run's record and `attnbench profile` alike): parameters,
    FLOPs per sample of a forward and of a training step (``loss_fn``: the run's objective,
    bench_cli.engine.objective) and the peak memory of a training step and of inference, per batch as
    measured (it does not scale linearly with the batch: parameters are shared).

    ``flops``: real | meta (fake tensors, falling back to real) | off. ``memory``: real | fake |
    auto (fake unless on CUDA) | off. ``budget_bytes``: refuse (PredictedOOM) a training step whose
    tracked peak exceeds it. Nothing else is caught: a measurement that cannot be made raises.
    ``into``: the dict to fill (and return), measurement by measurement, so what was measured
    before a failure is kept."""
    out: dict = {} if into is None else into
    out.update(params=count_parameters(model), **attention_parameters(model))
    if flops != "off":
        out.update(_counted_flops(model, inputs, loss_fn, batch_size, flops))
    if memory != "off" or budget_bytes is not None:
        out.update(_peak_memory(model, inputs, loss_fn, memory, _device(model, inputs), budget_bytes))
    return out


# --------------------------------------------------------------------------- a run's measurement


def example_batch(task, split: str, batch_size: int, device) -> dict:
    """The first ``batch_size`` samples of ``split`` as one batch (the task's collate)."""
    from torch.utils.data import DataLoader

    from bench_cli.core.task import to_device

    loader = DataLoader(task.dataset(split), batch_size=batch_size, shuffle=False, collate_fn=task.collate(split))
    return to_device(next(iter(loader)), device)


def measure_run(task, model, cfg, device, objective) -> dict:
    """A run's measurement columns: parameters, FLOPs per sample and peak memory of one training
    step of the run's objective (the KSVD term included) and of one inference batch, by the one
    measurement path (measure_model) as `attnbench profile` measures; the inference time
    (``measure.inference_samples``) and the heads' diversity (``measure.head_diversity``)."""
    from bench_cli.engine.head_diversity import record_head_diversity
    from bench_cli.results.schema import measurement_columns

    started = time.perf_counter()
    # one forward/backward of training: a micro-batch when the batch is accumulated (a 64 x 512-token
    # batch of the 267,744-word LM would need 35 GB of logits; training never holds it at once)
    size = min(int(cfg.trainer.batch_size), int(cfg.trainer.get("micro_batch_size") or cfg.trainer.batch_size))
    batch = example_batch(task, "train", size, device)
    flops = ("meta" if cfg.measure.get("meta_flops", False) else "real") if cfg.measure.flops else "off"
    memory = "real" if cfg.measure.memory else "off"
    cache = MeasureCache.of(cfg, model, task, batch, device, (flops, memory))
    measured = cache.load(count_parameters(model)) if cache else None
    if measured is None:
        with ValueReads() as reads:
            measured = measure_model(model, task.model_inputs(batch), objective.on(model, batch),
                                     task.batch_len(batch), flops=flops, memory=memory)
        if cache and not reads.seen:  # shapes alone decided the ops: the next job of these shapes reuses it
            cache.store(measured)
    out = {k: v for k, v in measured.items() if k not in ("flops_method", "memory_method")}
    samples = int(cfg.measure.get("inference_samples") or 0)
    if samples:
        out.update(inference_time(task, model, cfg, device, samples))
    out["peak_rss_bytes"] = process_peak_rss_bytes()
    out["measure_time_s"] = round(time.perf_counter() - started, 3)
    return measurement_columns(out) | record_head_diversity(cfg, task, model, device)


class MeasureCache:
    """Parameters, FLOPs and peak memory of a (model, task shape), measured by one job and reused by
    the next jobs of a sweep that have the same key (other seeds, above all): the semantic model
    and task config, the example batch (its shapes, dtypes and values), the measurement modes, the
    device type, torch's version and the source of every module the model is made of, of the task
    and of the measurement. Only measurements that read no tensor value are stored
    (ValueReads): they depend on the shapes, not on the weights. One JSON file
    per key in ``.measure_cache/`` beside ``results.path``, written atomically (parallel jobs);
    ``measure.cache=false`` turns it off."""

    def __init__(self, path: Path):
        self.path = path

    @classmethod
    def of(cls, cfg, model, task, batch: dict, device, modes: tuple) -> "MeasureCache | None":
        import hashlib
        import inspect

        from omegaconf import OmegaConf

        if not cfg.measure.get("cache", True) or modes == ("off", "off"):
            return None
        import models

        # the model zoo's code (helpers included), a plugin's modules, the task's, the measurement's
        sources = set(Path(models.__file__).parent.rglob("*.py"))
        sources |= {inspect.getsourcefile(cls) for m in model.modules() for cls in type(m).__mro__
                    if not cls.__module__.startswith(("torch", "builtins"))}
        sources |= {inspect.getsourcefile(type(task)), Path(__file__), Path(__file__).with_name("objective.py")}
        digest = hashlib.sha256()
        for part in (OmegaConf.to_container(cfg.model, resolve=True), OmegaConf.to_container(cfg.task, resolve=True),
                     modes, device.type, torch.__version__):
            digest.update(json.dumps(part, sort_keys=True, default=str).encode())
        for name in sorted(batch):
            value = batch[name]
            if torch.is_tensor(value):
                digest.update(f"{name}{tuple(value.shape)}{value.dtype}".encode())
                digest.update(value.detach().cpu().reshape(-1).view(torch.uint8).numpy().tobytes())
            else:
                digest.update(f"{name}{value!r}".encode())
        for source in sorted({Path(s) for s in sources if s}):
            digest.update(source.read_bytes())
        return cls(Path(cfg.results.path).parent / ".measure_cache" / f"{digest.hexdigest()[:32]}.json")

    def load(self, params: int) -> dict | None:
        """The entry, if it is one: a dict of numbers and strings measured on a model of ``params``
        parameters; anything else is a miss (measured again, with a warning)."""
        try:
            entry = json.loads(self.path.read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError):
            entry = None
        if isinstance(entry, dict) and entry.get("params") == params and all(
                v is None or (isinstance(v, (int, float, str)) and not isinstance(v, bool)) for v in entry.values()):
            return entry
        warn_once(f"warning: measurement cache {self.path} is not an entry for this model: measured again")
        return None

    def store(self, measured: dict) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            write_atomically(self.path, json.dumps(measured))
        except OSError:  # a read-only results folder: measured again next time
            pass


def inference_time(task, model, cfg, device, samples: int) -> dict:
    """Inference (eval mode, no gradients, ``trainer.precision``) over the first ``samples`` test
    samples in batches of ``eval_batch_size``, after one warm-up batch; data loading excluded.
    Pay-better-attention Table 4 reports the total over 5,000 samples (on an Apple M2):
    ``infer_time_s`` is that total (scaled to ``samples`` when the test split is smaller),
    ``infer_time_per_batch_s`` the median batch, with its quartiles. Ratios between attentions are
    what compares. Not time_rounds: each batch is new data, timed once."""
    from torch.utils.data import DataLoader

    from bench_cli.core.task import to_device
    from bench_cli.engine.env import autocast

    loader = DataLoader(task.dataset("test"), batch_size=int(cfg.trainer.eval_batch_size), shuffle=False,
                        collate_fn=task.collate("test"))
    was_training = model.training
    model.eval()
    times, seen, warm = [], 0, False
    try:
        with torch.no_grad(), autocast(device, str(cfg.trainer.get("precision", "32"))):
            for batch in loader:
                keep = min(task.batch_len(batch), samples - seen)
                batch = {k: v[:keep] for k, v in batch.items()}  # the last batch holds only what is missing
                inputs = task.model_inputs(to_device(batch, device))
                if not warm:
                    model(**inputs)
                    warm = True
                times.append(seconds(lambda: model(**inputs), device))
                seen += task.batch_len(batch)
                if seen >= samples:
                    break
    finally:
        model.train(was_training)
    if not times:
        return {}
    return {"infer_time_s": round(sum(times) * samples / seen, 6), "infer_samples": seen,
            "infer_batch_size": int(cfg.trainer.eval_batch_size),
            **Spread.of(times).columns("infer_time_per_batch_s")}
