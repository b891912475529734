"""Model side of attnbench: attention variants (``models.attention``) and backbones."""
from __future__ import annotations

if __name__ == "models":  # the old top-level name, imported before attnbench: one copy, under attnbench
    import attnbench.legacy_paths

    attnbench.legacy_paths.adopt(__name__)

from bench_cli.core.registry import is_builtin  # noqa: F401  (public here too: plugins may import it from models)
