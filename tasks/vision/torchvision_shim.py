"""The one place that imports torchvision (and timm, which imports torchvision).

Why a shim: the torchvision 0.28.0 wheel pinned with the CPU torch 2.13.0 (constraints.txt) carries
compiled ops linked against the CUDA build of torch. Over the CPU torch its extension does not load,
so the operators ``torchvision::nms`` and ``torchvision::qnms`` are never defined, and
``import torchvision`` dies in ``torchvision/_meta_registrations.py``, which registers fake
(meta) kernels for them: ``RuntimeError: operator torchvision::nms does not exist``. Defining the
two schemas first with ``torch.library`` lets that registration succeed; datasets, transforms v2
and models then import and work. The compiled ops themselves (nms, roi_align, ...) and
``torchvision.io`` image decoding stay unavailable, which attnbench never uses: images are decoded
with PIL (torchvision's default ImageFolder loader).

The shim is applied only when the plain import fails with exactly that error; on a machine where
torchvision's ops load (a matching CUDA torch) nothing is defined. Everything else imports
torchvision and timm through :func:`import_torchvision` / :func:`import_timm`
(tests/test_vision.py checks that no other module imports them).
"""
from __future__ import annotations

import sys

from bench_cli.core.extras import require

# The schemas torchvision/_meta_registrations.py registers fake kernels for (torchvision/csrc/ops/nms.cpp).
MISSING_OPS = {
    "nms": "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms": "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
}
MISSING_OP_ERROR = "operator torchvision::nms does not exist"

_library = None  # the torch.library.Library holding the schemas; kept alive (dropping it unregisters them)
applied = False  # whether the schemas had to be defined in this process


def _forget_partial_import() -> None:
    """A failed import leaves half-initialised torchvision modules behind; drop them before retrying."""
    for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
        del sys.modules[name]


def define_missing_ops() -> None:
    """Define the schemas of ``torchvision::nms`` and ``torchvision::qnms`` (no kernels)."""
    global _library, applied
    import torch

    if _library is None:
        _library = torch.library.Library("torchvision", "DEF")  # noqa: TOR901 - schemas only
        for schema in MISSING_OPS.values():
            _library.define(schema)
    applied = True


def import_torchvision():
    """``import torchvision``, defining the two missing schemas first if the plain import fails
    with "operator torchvision::nms does not exist"; any other error propagates."""
    try:
        torchvision = require("torchvision", "vision", "the vision family")
    except RuntimeError as e:
        if MISSING_OP_ERROR not in str(e):
            raise
        _forget_partial_import()
        define_missing_ops()
        import torchvision
    import torchvision.transforms.v2  # noqa: F401  (a submodule `import torchvision` does not load)
    return torchvision


def import_timm(submodule: str | None = None):
    """``import timm`` (it imports torchvision, so through the shim), or one of its submodules
    (``"loss"``, ``"data"``...)."""
    import importlib

    import_torchvision()
    timm = require("timm", "vision", "the vision family")
    return importlib.import_module(f"timm.{submodule}") if submodule else timm
