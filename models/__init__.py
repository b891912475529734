"""Model side of attnbench: attention variants (``models.attention``) and backbones."""
from __future__ import annotations

from bench_cli.core.registry import is_builtin  # noqa: F401  (public here too: plugins may import it from models)
