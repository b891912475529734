"""Model side of attnbench: attention variants (``models.attention``) and backbones."""
from __future__ import annotations


def is_builtin(module: str) -> bool:
    """Whether ``module`` is attnbench's own (models.*, tasks.*), not a plugin's. Here, not in
    models.attention.registry, so that `attnbench ls` can ask without importing torch."""
    return module.split(".")[0] in ("models", "tasks")
