"""attnbench's one import namespace.

The repository keeps its layers in top-level folders (bench_cli/, models/, tasks/, conf/:
docs/architecture.md), but an installed top-level ``models`` or ``tasks`` collides with the
folder of the same name that almost every research project has: with a project's own ``models/``
on ``sys.path`` every command failed. So the three generic names are imported, and installed, only
under this package: ``attnbench.models`` (attentions, backbones), ``attnbench.tasks`` (task
families) and ``attnbench.conf`` (the Hydra configs). A plugin imports the public API from here::

    from attnbench import Capabilities, ProjectedAttention, register_attention, register_task

``import attnbench`` is light (it imports neither torch nor Hydra): the names above are looked up
on first use (PEP 562), so that `attnbench --help` still answers at once.

The old paths (``from models.attention import register_attention``) keep working, with a
DeprecationWarning, while no other ``models`` or ``tasks`` is importable (attnbench.legacy_paths).
"""
from __future__ import annotations

from pathlib import Path

_HERE = Path(__file__).resolve().parent
# In the repository (an editable install, or PYTHONPATH pointing at a checkout) the subpackages are
# the top-level folders beside this one; in an installed wheel they are inside this folder.
if not (_HERE / "models").is_dir() and (_HERE.parent / "models" / "__init__.py").is_file():
    __path__.append(str(_HERE.parent))  # noqa: F821 - a package's __path__

# The public API of plugins (docs/models.md "Bring your own attention"): name -> module defining it.
PUBLIC = {
    "register_attention": "attnbench.models.attention",
    "Capabilities": "attnbench.models.attention",
    "ProjectedAttention": "attnbench.models.attention",
    "build_attention": "attnbench.models.attention",
    "register_task": "attnbench.tasks",
}
__all__ = sorted(PUBLIC)


def __getattr__(name: str):
    if name in PUBLIC:
        import importlib

        return getattr(importlib.import_module(PUBLIC[name]), name)
    raise AttributeError(f"module 'attnbench' has no attribute {name!r}")


from attnbench import legacy_paths  # noqa: E402

legacy_paths.install(__path__)  # noqa: F821 - a package's __path__
