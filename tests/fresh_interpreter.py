"""What a fresh interpreter shows, asked of one interpreter for the tests that need one (each costs
2-3 s of imports): which heavy modules discovering the tasks imports (tests/test_configs.py), then
how torchvision imports there, plainly and through the project's shim (tests/test_vision.py). The
discovery is read first, before anything else is imported. Those tests are one xdist group
("fresh_interpreter"), so that one worker starts it."""
from __future__ import annotations

import functools
import json
import subprocess
import sys
from pathlib import Path

GROUP = "fresh_interpreter"
ROOT = Path(__file__).resolve().parents[1]
# The families' heavy dependencies (and the text family's models), none of which discovering the
# tasks may import (DESIGN.md: everything heavy is optional and lazy).
HEAVY = ["torchvision", "timm", "mlxtend", "sacrebleu", "datasets", "pandas", "gymnasium", "mujoco", "h5py",
         "sktime", "PIL", "attnbench.models.text"]

CODE = f"""
import json, sys
import attnbench.tasks as tasks
tasks.discover()
report = {{"registered": tasks.available_tasks(), "heavy": [m for m in {HEAVY!r} if m in sys.modules]}}
import torch
try:
    import torchvision
    report["plain"] = "ok"
except RuntimeError as e:
    report["plain"] = str(e)
from attnbench.tasks.vision import torchvision_shim
tv = torchvision_shim.import_torchvision()
report["applied"], report["version"] = torchvision_shim.applied, tv.__version__.split("+")[0]
report["fake kernels"] = [op for op in ("nms", "qnms")
                          if torch._C._dispatch_has_kernel_for_dispatch_key(f"torchvision::{{op}}", "Meta")]
report["v2 crop"] = list(tv.transforms.v2.RandomResizedCrop(8)(torch.rand(3, 16, 16)).shape)
report["datasets"] = hasattr(tv.datasets, "CIFAR100")
report["timm mixup"] = hasattr(torchvision_shim.import_timm().data, "Mixup")
print(json.dumps(report))
"""


@functools.cache
def report() -> dict:
    """The fresh interpreter's answers: ``registered`` (the tasks), ``heavy`` (those of HEAVY that
    discovery imported), ``plain`` ("ok" or the plain torchvision import's error), ``applied`` and
    ``version`` (the shim's), ``fake kernels`` (of nms and qnms, registered for the Meta key), ``v2
    crop`` (the shape transforms v2 crops to), ``datasets`` and ``timm mixup`` (found)."""
    done = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])
