"""One registry for every attention variant (xformers-style zoo).

A variant is registered by name together with what it supports, so tasks can refuse
impossible pairs (e.g. a causal language model with a variant that cannot be causal)
with a clear message instead of failing deep inside a forward pass. The names are kept by the
project's one ``Registry`` (bench_cli/core/registry.py): a taken name is refused naming both
modules, an unknown one lists the valid names.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass, field
from collections.abc import Callable

import torch.nn as nn

from bench_cli.core.registry import NameTakenError, Registry, is_builtin  # noqa: F401  (public here too, for plugins)


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


# name -> AttentionSpec; its owner is the module that called register_attention.
ATTENTIONS: Registry[AttentionSpec] = Registry("attention")


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
        def build(**options):
            return factory(**{**preset, **options})

        spec = AttentionSpec(
            name=name,
            factory=build,
            paper=paper,
            equation=equation,
            capabilities=capabilities or Capabilities(),
            summary=summary or ((factory.__doc__ or "").strip().splitlines() or [""])[0],
            owner=owner,
        )
        ATTENTIONS.register(name, spec, owner=owner)
        return factory

    return deco


def available_attentions() -> list[str]:
    return ATTENTIONS.names()


def attention_spec(name: str) -> AttentionSpec:
    """The spec registered as ``name``; an unknown name is one line listing the valid ones."""
    return ATTENTIONS.get(name)


def build_attention(name: str, *, d_model: int, n_heads: int, **options) -> nn.Module:
    """Build the variant ``name`` mapping (batch, length, d_model) to the same shape."""
    spec = attention_spec(name)
    module = spec.factory(d_model=d_model, n_heads=n_heads, **options)
    module.registered_name = name  # how errors about it name it (models.layers.attend)
    module.declared = spec.capabilities  # what it may be asked: the base refuses the rest (base.AttentionBase)
    return module
