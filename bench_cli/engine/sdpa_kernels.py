"""Which kernels ``F.scaled_dot_product_attention`` actually ran, not which were asked for.

``sdpa_kernel([...])`` only restricts torch's choice, and torch may fall back (the CPU's flash
kernel takes no dropout, so a training step with attention dropout runs the math path; CUDA's
flash kernel takes no float32). ``SdpaKernels`` watches one step: it counts the calls of
``F.scaled_dot_product_attention`` (a torch-function mode, above autograd) and notes the fused ATen
kernels that ran (a dispatch mode, below it: ``_scaled_dot_product_flash_attention_for_cpu``,
``_scaled_dot_product_efficient_attention``, ``_scaled_dot_product_cudnn_attention``...). Calls
with no fused kernel ran the math path, which decomposes into matmul + softmax before dispatch.
"""
from __future__ import annotations

import torch.nn.functional as F
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["SdpaKernels", "kernel_name"]

_FUSED_PREFIX = "_scaled_dot_product_"


def kernel_name(op: str) -> str:
    """'flash_attention_for_cpu' from '_scaled_dot_product_flash_attention_for_cpu_backward'."""
    return op.removeprefix(_FUSED_PREFIX).removesuffix("_backward")


class _Calls(TorchFunctionMode):
    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is F.scaled_dot_product_attention:
            self.count += 1
        return func(*args, **(kwargs or {}))


class _FusedOps(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.seen: set[str] = set()
        self.forwards = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name.startswith(_FUSED_PREFIX):
            self.seen.add(kernel_name(name))
            self.forwards += not name.endswith("_backward")
        return func(*args, **(kwargs or {}))


class SdpaKernels:
    """``with SdpaKernels() as kernels: step()``; then ``kernels.ran``: 'flash_attention_for_cpu',
    'math', 'efficient_attention + math' (fused and fallen-back calls in one step), or '' when the
    step called no scaled_dot_product_attention."""

    def __enter__(self) -> SdpaKernels:
        self._calls, self._ops = _Calls(), _FusedOps()
        self._calls.__enter__()
        self._ops.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._ops.__exit__(*exc)
        self._calls.__exit__(*exc)

    @property
    def ran(self) -> str:
        # one fused forward per call when every call was fused; fewer: the others took the math path
        math = self._calls.count > self._ops.forwards
        return " + ".join([*sorted(self._ops.seen), *(["math"] if math else [])])
