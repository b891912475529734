"""One registry for every attention variant (xformers-style zoo).

A variant is registered by name together with what it supports, so tasks can refuse
impossible pairs (e.g. a causal language model with a variant that cannot be causal)
with a clear message instead of failing deep inside a forward pass.
"""
from __future__ import annotations

import difflib
import sys
from dataclasses import dataclass, field
from typing import Callable

import torch.nn as nn

from models import is_builtin  # noqa: F401  (public here too: tasks and plugins import it from the registry)


@dataclass(frozen=True)
class Capabilities:
    """What a variant can do. Checked by tasks before a model is built. Nothing is claimed unless
    declared: every default is False but ``variable_length`` (a kernel of q, k, v has no length of
    its own; declare False for parameters sized by the length, which then get ``max_len``)."""

    causal: bool = False  # supports forward(..., causal=True)
    padding_mask: bool = False  # honours a (batch, length) key padding mask
    variable_length: bool = True  # works for any sequence length (Super needs a fixed l)
    extra_loss: bool = False  # exposes an auxiliary loss (Primal's KSVD objective)
    needs_grid: bool = False  # takes a 2D token layout `grid=(H, W)` (Conv2D attention)
    cross: bool = False  # attends to a second sequence: forward(x, context=..., context_mask=...)
    sized_by_max_len: bool = False  # takes the task's length as `max_len` to size parameters, runs at any length
    # The reference takes statistics over the whole batch (e.g. a batch-wide maximum), so a sample's
    # output depends on the other samples of its batch; `attnbench check-attention` then does not
    # check that samples are independent.
    batch_coupled: bool = False


@dataclass(frozen=True)
class AttentionSpec:
    name: str
    factory: Callable[..., nn.Module]
    paper: str
    equation: str
    capabilities: Capabilities = field(default_factory=Capabilities)
    summary: str = ""
    owner: str = ""  # the module that registered the name (a plugin's, or models.attention.<file>)

    @property
    def builtin(self) -> bool:
        return is_builtin(self.owner)


class NameTakenError(ValueError):
    """A second module registers a name another has: refused, naming both (plugins must not
    silently replace a built-in or each other)."""

    def __init__(self, kind: str, name: str, owner: str, newcomer: str):
        super().__init__(f"{kind} '{name}' is already registered by {owner}"
                         f"{' (built-in)' if is_builtin(owner) else ''}; {newcomer} cannot register it again: "
                         f"choose another name")
        self.kind, self.name, self.owner, self.newcomer = kind, name, owner, newcomer


_REGISTRY: dict[str, AttentionSpec] = {}


class UnknownAttentionError(KeyError):
    def __init__(self, name: str):
        choices = available_attentions()
        close = difflib.get_close_matches(name, choices, n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        super().__init__(f"unknown attention '{name}'{hint}; valid: {', '.join(choices)}")
        self.name = name

    def __str__(self) -> str:  # KeyError quotes its message otherwise
        return self.args[0]


def register_attention(
    name: str,
    *,
    paper: str,
    equation: str,
    capabilities: Capabilities | None = None,
    summary: str = "",
    **preset: object,
) -> Callable:
    """Register ``factory`` under ``name``; ``preset`` are default options bound to it.

    Presets let one class serve several names (``attention_bn`` is the softmax kernel
    with the BN modifier switched on), so modifiers compose with kernels instead of
    being copied into them.

    Public API (stable, for plugins: bench_cli/config/plugins.py): the module that calls it owns
    ``name``; another module registering the same name gets a ``NameTakenError`` naming both.
    """
    owner = sys._getframe(1).f_globals.get("__name__", "?")  # the caller: who registers (no public API)

    def deco(factory: Callable[..., nn.Module]):
        if name in _REGISTRY:
            raise NameTakenError("attention", name, _REGISTRY[name].owner, owner)

        def build(**options):
            return factory(**{**preset, **options})

        _REGISTRY[name] = AttentionSpec(
            name=name,
            factory=build,
            paper=paper,
            equation=equation,
            capabilities=capabilities or Capabilities(),
            summary=summary or ((factory.__doc__ or "").strip().splitlines() or [""])[0],
            owner=owner,
        )
        return factory

    return deco


def available_attentions() -> list[str]:
    return sorted(_REGISTRY)


def attention_spec(name: str) -> AttentionSpec:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise UnknownAttentionError(name) from None


def build_attention(name: str, *, d_model: int, n_heads: int, **options) -> nn.Module:
    """Build the variant ``name`` mapping (batch, length, d_model) to the same shape."""
    spec = attention_spec(name)
    module = spec.factory(d_model=d_model, n_heads=n_heads, **options)
    module.registered_name = name  # how errors about it name it (models.layers.attend)
    module.declared = spec.capabilities  # what it may be asked: the base refuses the rest (base.AttentionBase)
    return module
