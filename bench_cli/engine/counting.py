"""Counting what one step of a model costs: parameters, counted FLOPs and peak memory, by the one
measurement path (``measure_model``) that a run's record and `attnbench profile` share.
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
      (``torch.distributed._tools.mem_tracker``; only its global peak is kept,
      ``_total_peak_tracker``), a dispatch mode that records the untyped storage of every
      tensor an ATen op returns and drops it when the storage is freed (weakref), keeping
      the running maximum of the live bytes after each op. It is
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
import functools
import gc
import math
import resource
import sys
from typing import Any
from collections.abc import Callable, Iterator

import torch
import torch.nn as nn
from torch.utils import flop_counter
from torch.utils._pytree import tree_flatten, tree_map_only
from torch.utils._python_dispatch import TorchDispatchMode

from bench_cli.core.errors import is_oom

__all__ = [
    "MetaCountingError",
    "PredictedOOM",
    "ValueReads",
    "attention_parameters",
    "call_model",
    "count_parameters",
    "cuda_memory_columns",
    "ensure_sdpa_formulas",
    "flops_forward",
    "flops_train_step",
    "is_attention_module",
    "is_oom",
    "measure_model",
    "peak_memory_inference",
    "peak_memory_train_step",
    "per_sample",
    "process_peak_rss_bytes",
    "storage_bytes",
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
    from attnbench.models.attention.base import AttentionBase

    mod = getattr(type(m), "__module__", "")
    return mod == "attnbench.models.attention" or mod.startswith("attnbench.models.attention.") or isinstance(m, AttentionBase)


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


def call_model(model: nn.Module, inputs: Inputs):
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


def _in_precision(forward: Callable[[], Any], device: torch.device, precision: str) -> Callable[..., Any]:
    """``call(loss_fn=None)``: the forward (and ``loss_fn`` on its output) under the autocast of
    ``trainer.precision`` (bench_cli.engine.env.autocast), as the trainer's forward_loss runs them;
    the backward runs outside it, as the trainer's."""
    from bench_cli.engine.env import autocast

    def call(loss_fn: LossFn | None = None):
        with autocast(device, precision):
            out = forward()
            return out if loss_fn is None else loss_fn(out)
    return call


@contextlib.contextmanager
def _runner(model: nn.Module, inputs: Inputs, *, train: bool, meta: bool, precision: str = "32"):
    """Yield ``(call, state, device)``: ``call()`` runs the model once on ``inputs`` (fake
    copies when ``meta``) in ``precision`` (``call(loss_fn)``: and the loss on its output);
    ``state`` are the parameters, buffers and tensor inputs it uses."""
    device = _device(model, inputs, skip_meta=meta)
    with _undisturbed(model, train, device):
        if not meta:
            state = [*model.parameters(), *model.buffers(), *_tensors(inputs)]
            yield _in_precision(lambda: call_model(model, inputs), device, precision), state, device
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
                yield _in_precision(call, device, precision), [*fake_state.values(), *_tensors(fake_inputs)], device
            except (RuntimeError, NotImplementedError) as e:
                raise MetaCountingError(
                    f"{type(model).__name__} cannot run on fake/meta tensors "
                    f"({type(e).__name__}: {e}); measure with meta=False"
                ) from e


def _train_step(call: Callable[..., Any], loss_fn: LossFn) -> None:
    with torch.enable_grad():
        loss = call(loss_fn)
        if not (isinstance(loss, torch.Tensor) and loss.dim() == 0):
            raise ValueError(f"loss_fn must return a scalar tensor, got {type(loss).__name__} "
                             f"of shape {tuple(getattr(loss, 'shape', ()))}")
        loss.backward()


def _measured_pass(model: nn.Module, inputs: Inputs, loss_fn: LossFn | None, *, meta: bool, precision: str,
                   flops: bool, memory: bool) -> tuple[int | None, int | None]:
    """(FLOPs, peak bytes) of one training step (``loss_fn`` given: forward, loss and backward in
    train mode) or of one inference pass (eval mode, no_grad), each only when asked, both from the
    same pass: FlopCounterMode allocates nothing, so the peak is that of a pass without it, and the
    tracker runs no op, so the count is that of a pass without it (tests/test_measure.py). A
    measurement of both runs the model once per step instead of twice."""
    if not (flops or memory):
        return None, None
    train = loss_fn is not None
    counter = flop_counter.FlopCounterMode(display=False) if flops else contextlib.nullcontext()
    with _runner(model, inputs, train=train, meta=meta, precision=precision) as (call, state, device):
        def run() -> None:
            with counter, contextlib.nullcontext() if train else torch.no_grad():
                _train_step(call, loss_fn) if train else call()

        peak = _peak(run, state, device, meta) if memory else run()
    return (counter.get_total_flops() if flops else None), peak


# --------------------------------------------------------------------------- FLOPs


def flops_forward(model: nn.Module, inputs: Inputs, *, meta: bool = False, precision: str = "32") -> int:
    """FLOPs of one forward pass over the whole batch (eval mode, no_grad)."""
    return _measured_pass(model, inputs, None, meta=meta, precision=precision, flops=True, memory=False)[0]


def flops_train_step(model: nn.Module, inputs: Inputs, loss_fn: LossFn, *, meta: bool = False,
                     precision: str = "32") -> int:
    """FLOPs of forward + ``loss_fn(output)`` + backward over the whole batch (train mode, no optimizer step)."""
    return _measured_pass(model, inputs, loss_fn, meta=meta, precision=precision, flops=True, memory=False)[0]


def per_sample(x: int | float, batch_size: int) -> float:
    """``x / batch_size`` (per-sample value of a whole-batch measurement)."""
    if batch_size <= 0:
        raise ValueError(f"batch_size must be positive, got {batch_size}")
    return x / batch_size


# --------------------------------------------------------------------------- peak memory

_CUDA_BLOCK = 512  # the CUDA caching allocator rounds every allocation up to 512 bytes


def storage_bytes(tensors: list[torch.Tensor], device: torch.device) -> int:
    """Bytes of the distinct storages of ``tensors`` on ``device``, each rounded up to the CUDA
    allocator's 512-byte blocks: what they hold of the allocator's memory."""
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
    return torch.cuda.max_memory_allocated(device) - baseline + storage_bytes(state, device)


@functools.cache
def _total_peak_tracker():
    """The class of a ``MemTracker`` that keeps only what is read of it: each device's peak total.

    MemTracker's ``_update_peak_stats`` runs after every op: it walks every module it has seen to
    update that module's own peak, and deep-copies the device's whole snapshot each time the peak
    rises (after nearly every op of a forward). Neither is read here, and they were a quarter of a
    tracked step's time (more for deeper models). This override keeps MemTracker's global rule
    (``_peak_mem``: the device's ``Total`` after the op, if higher) and nothing else.
    Private names it relies on, checked against torch 2.13: ``_update_peak_stats(peak_state)``
    (called by ``__torch_dispatch__`` after each op, and only there) and ``_curr_mem_snap``
    ({device: {reference type or "Total": bytes}}); tests/test_measure.py compares the peak with
    MemTracker's own peak snapshot."""
    from torch.distributed._tools.mem_tracker import MemTracker

    class TotalPeakTracker(MemTracker):
        def __init__(self) -> None:
            super().__init__()
            self.peak_bytes: dict[torch.device, int] = {}

        def _update_peak_stats(self, peak_state) -> None:
            for device, snapshot in self._curr_mem_snap.items():
                if self.peak_bytes.get(device, 0) < snapshot["Total"]:
                    self.peak_bytes[device] = snapshot["Total"]

    return TotalPeakTracker


def _peak_tracked(call: Callable[[], Any], state: list[torch.Tensor], device: torch.device) -> int:
    # No gc.collect() first: the tracker counts only what is allocated inside the region (and the
    # state it is given), and with the collector off inside it, garbage left from before is neither
    # counted nor freed there. A full collection cost 0.15-0.3 s per measurement in a process holding
    # torch and Hydra (twice a run, twice a profile point) and changed no peak.
    was_enabled = gc.isenabled()
    gc.disable()  # frees happen by reference counting only: deterministic
    try:
        tracker = _total_peak_tracker()()
        tracker.track_external(*state)
        with tracker:
            call()
    finally:
        if was_enabled:
            gc.enable()
    return tracker.peak_bytes.get(device, 0)


def _peak(run: Callable[[], Any], state: list[torch.Tensor], device: torch.device, meta: bool) -> int:
    if device.type == "cuda" and not meta:
        return _peak_cuda(run, state, device)
    return _peak_tracked(run, state, device)


def peak_memory_train_step(model: nn.Module, inputs: Inputs, loss_fn: LossFn, *, meta: bool = False,
                           precision: str = "32") -> int:
    """Peak bytes of forward + loss + backward (train mode) over the whole batch; see the module doc."""
    return _measured_pass(model, inputs, loss_fn, meta=meta, precision=precision, flops=False, memory=True)[1]


def peak_memory_inference(model: nn.Module, inputs: Inputs, *, meta: bool = False, precision: str = "32") -> int:
    """Peak bytes of one forward pass (eval mode, no_grad) over the whole batch; see the module doc."""
    return _measured_pass(model, inputs, None, meta=meta, precision=precision, flops=False, memory=True)[1]


def process_peak_rss_bytes() -> int:
    """Peak resident set size of this process so far (everything: Python, libraries, allocator caches)."""
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss if sys.platform == "darwin" else rss * 1024  # macOS reports bytes, Linux KiB


# --------------------------------------------------------------------------- all measurements


class PredictedOOM(MemoryError):
    """The tracked peak of a training step exceeds the memory budget (``profile.memory_budget_gb``)."""


def _passes(model: nn.Module, inputs: Inputs, loss_fn: LossFn, *, meta: bool, precision: str, flops: bool,
            memory: tuple[bool, bool]) -> dict[str, tuple[int | None, int | None]]:
    """{"train": (FLOPs, peak), "infer": (FLOPs, peak)}: a training step and an inference pass on
    fake (``meta``) or real tensors, each run once for what is asked of it (``memory``: the
    training peak, the inference peak)."""
    return {"infer": _measured_pass(model, inputs, None, meta=meta, precision=precision, flops=flops,
                                    memory=memory[1]),
            "train": _measured_pass(model, inputs, loss_fn, meta=meta, precision=precision, flops=flops,
                                    memory=memory[0])}


def _flops_columns(passes: dict, batch_size: int, tensors: str) -> dict:
    return {"flops_forward": per_sample(passes["infer"][0], batch_size),
            "flops_train_step": per_sample(passes["train"][0], batch_size),
            "flops_method": f"FlopCounterMode on {tensors}"}


def _flops_and_memory(model: nn.Module, inputs: Inputs, loss_fn: LossFn, batch_size: int, device: torch.device, *,
                      flops: str, memory: str, budget_bytes: int | None, precision: str, into: dict) -> dict:
    """measure_model's FLOPs and peaks on ``device`` (see there). What runs on fake tensors runs
    first (FLOPs when meta; the peaks when fake, or auto off CUDA; the training peak for the
    budget), then the budget is checked, then what runs on real tensors: nothing real runs for a
    step that the budget refuses. A model that reads tensor values (MetaCountingError) is measured
    on real tensors instead, or refused under a budget off CUDA (its peak cannot be predicted)."""
    fake_flops, real_flops = flops == "meta", flops == "real"
    fake_memory = memory == "fake" or (memory == "auto" and device.type != "cuda")
    real_memory = memory != "off" and not fake_memory
    if fake_flops or fake_memory or budget_bytes is not None:
        try:
            fake = _passes(model, inputs, loss_fn, meta=True, precision=precision, flops=fake_flops,
                           memory=(fake_memory or budget_bytes is not None, fake_memory))
        except MetaCountingError:
            if budget_bytes is not None and device.type != "cuda":
                raise PredictedOOM("cannot estimate the peak on fake tensors, so it is not run under "
                                   "profile.memory_budget_gb; set profile.memory_budget_gb=null to run it anyway") from None
            real_flops, real_memory = real_flops or fake_flops, real_memory or fake_memory
        else:
            if fake_flops:
                into.update(_flops_columns(fake, batch_size, "fake tensors"))
            train_peak = fake["train"][1]
            if budget_bytes is not None and train_peak > budget_bytes:
                raise PredictedOOM(f"tracked training peak {train_peak / 2**30:.2f} GiB > profile.memory_budget_gb="
                                   f"{budget_bytes / 2**30:.2f} GiB (not run)")
            if fake_memory:
                into.update(peak_mem_train_bytes=train_peak, peak_mem_infer_bytes=fake["infer"][1],
                            memory_method=f"MemTracker on fake tensors ({device.type})")
    if real_flops or real_memory:
        real = _passes(model, inputs, loss_fn, meta=False, precision=precision, flops=real_flops,
                       memory=(real_memory, real_memory))
        if real_flops:
            into.update(_flops_columns(real, batch_size, "real tensors"))
        if real_memory:
            into.update(peak_mem_train_bytes=real["train"][1], peak_mem_infer_bytes=real["infer"][1],
                        memory_method=("CUDA allocator peak" if device.type == "cuda"
                                       else f"MemTracker on real tensors ({device.type})"))
            if device.type == "cuda":  # the allocator's peak, and beside it the estimate a CPU run would record
                into.update(cuda_memory_columns(model, inputs, loss_fn, precision))
    return into


def cuda_memory_columns(model: nn.Module, inputs: Inputs, loss_fn: LossFn, precision: str = "32") -> dict:
    """What a CUDA measurement records beside ``peak_mem_*_bytes`` (there the allocator's peak,
    ``torch.cuda.max_memory_allocated``): which method gave them, and the MemTracker estimate on
    fake tensors (what the CPU records; None when the model reads tensor values)."""
    try:
        train, infer = (peak_memory_train_step(model, inputs, loss_fn, meta=True, precision=precision),
                        peak_memory_inference(model, inputs, meta=True, precision=precision))
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
                  memory: str = "real", budget_bytes: int | None = None, precision: str = "32",
                  into: dict | None = None) -> dict[str, int | float | str]:
    """The one measurement path (a run's record and `attnbench profile` alike): parameters,
    FLOPs per sample of a forward and of a training step (``loss_fn``: the run's objective,
    bench_cli.engine.objective) and the peak memory of a training step and of inference, per batch as
    measured (it does not scale linearly with the batch: parameters are shared).

    ``flops``: real | meta (fake tensors, falling back to real) | off. ``memory``: real | fake |
    auto (fake unless on CUDA) | off. ``budget_bytes``: refuse (PredictedOOM) a training step whose
    tracked peak exceeds it. ``precision``: ``trainer.precision``'s autocast around the forward and
    the loss, as training runs them. Nothing else is caught: a measurement that cannot be made raises.
    ``into``: the dict to fill (and return), measurement by measurement, so what was measured
    before a failure is kept. A step's FLOPs and peak on the same kind of tensors come from one
    pass of it (_measured_pass), and nothing runs on real tensors before the budget is checked."""
    out: dict = {} if into is None else into
    out.update(params=count_parameters(model), **attention_parameters(model))
    return _flops_and_memory(model, inputs, loss_fn, batch_size, _device(model, inputs), flops=flops, memory=memory,
                             budget_bytes=budget_bytes, precision=precision, into=out)
