"""Which attention each role and layer of a model uses, built from the registry by name.

A model config names ``attention`` (every layer), optionally ``cross_attention`` (the
cross-attention of a decoder, when it differs) and, for Primal.+ (Primal-Attention supplement,
Table 5), ``final_attention`` (the last layer); backbones receive one attention module per layer,
for one role (``build_layer_attentions``) or for every role they have (``build_role_attentions``).
"""
from __future__ import annotations

import torch.nn as nn
from omegaconf import DictConfig, OmegaConf

from attnbench.models.attention import attention_spec, build_attention


def _options(cfg) -> dict:
    if isinstance(cfg, DictConfig):
        cfg = OmegaConf.to_container(cfg, resolve=True)
    return dict(cfg or {})


# The attention roles a model can have, what each means and what it needs from the registry.
ROLES = {
    "encoder": "self-attention",
    "decoder": "causal self-attention",
    "cross": "cross-attention",
}
ROLE_NEEDS: dict[str, dict[str, bool]] = {"encoder": {}, "decoder": {"causal": True}, "cross": {"cross": True}}


def layer_attention_configs(model_cfg, n_layers: int, role: str = "encoder") -> list[dict]:
    """Per-layer attention options of one role's stack.

    ``model.attention`` is used by every role and layer, unless ``model.cross_attention`` names
    the cross-attention; ``model.final_attention`` replaces the last layer of each self-attention
    stack (encoder, decoder): Primal.+ (Primal-Attention supplement, Table 5)."""
    if role not in ROLES:
        raise ValueError(f"unknown attention role '{role}' ({', '.join(ROLES)})")
    base = _options(model_cfg.get("cross_attention") if role == "cross" and model_cfg.get("cross_attention")
                    else model_cfg.attention)
    configs = [dict(base) for _ in range(n_layers)]
    final = _options(model_cfg.get("final_attention"))
    if final and role != "cross" and n_layers:
        configs[-1] = final
    return configs


def capability_problems(model_cfg, stacks: dict[str, int], requires: dict[str, bool] | None = None) -> list[str]:
    """Why the model's attentions cannot fill the task's roles (empty: they can). ``stacks`` maps
    each role to its number of layers; ``requires`` applies to every role (e.g. a padding mask).
    Messages name the variant, the role and the layers: "primal cannot be the cross-attention
    (layers 1-2 of 2): it lacks cross"."""
    problems: dict[tuple[str, str, str], list[int]] = {}
    for role, n_layers in stacks.items():
        needs = {**(requires or {}), **ROLE_NEEDS[role]}
        for i, options in enumerate(layer_attention_configs(model_cfg, n_layers, role)):
            caps = attention_spec(options["name"]).capabilities
            for cap, needed in needs.items():
                if needed and not getattr(caps, cap):
                    problems.setdefault((options["name"], role, cap), []).append(i + 1)
    out = []
    for (name, role, cap), layers in problems.items():
        n = stacks[role]
        where = f"layer {layers[0]}" if len(layers) == 1 else f"layers {layers[0]}-{layers[-1]}"
        out.append(f"{name} cannot be the {ROLES[role]} ({where} of {n}): it lacks {cap}")
    return out


def build_layer_attentions(model_cfg, n_layers: int, d_model: int, n_heads: int, seq_len: int | None,
                           grid: tuple[int, int] | None = None, role: str = "encoder",
                           attention_dropout: float | None = None) -> list[nn.Module]:
    """One attention module per layer. ``grid`` is the task's 2D token layout (image patches);
    sequence tasks have none, and a variant that needs one (Conv2D) then sees the sequence as a
    1 x N grid, where its (k_h, k_w) kernel acts along the sequence only (documented in docs/models.md).
    ``attention_dropout`` (a backbone option; None keeps the model's) sets the attention-probability
    dropout of every layer, as the LRA code's and mvts_transformer's ``attention_dropout``/``dropout``.
    Variants sized by the sequence length (Super's W^A, Primal's ``rows: code``) get ``seq_len``
    as ``max_len`` unless the model sets one."""
    modules = []
    for options in layer_attention_configs(model_cfg, n_layers, role):
        name = options.pop("name")
        caps = attention_spec(name).capabilities
        if (not caps.variable_length or caps.sized_by_max_len) and options.get("max_len") is None:
            options["max_len"] = seq_len  # Super attention's W^A is l x l for the task's context length
        if caps.needs_grid and options.get("grid") is None:
            options["grid"] = grid if grid is not None else (1, seq_len)
        if attention_dropout is not None:
            options["dropout"] = float(attention_dropout)
        modules.append(build_attention(name, d_model=d_model, n_heads=n_heads, **options))
    # Variants whose reference shares parameters between layers tie them here (Linformer's one E)
    for tie in {getattr(type(m), "tie_layers", None) for m in modules} - {None}:
        tie(modules)
    return modules


def build_role_attentions(model_cfg, stacks: dict[str, int], d_model: int, n_heads: int,
                          seq_len: int | dict[str, int | None] | None, grid: tuple[int, int] | None = None,
                          requires: dict[str, bool] | None = None) -> dict[str, list[nn.Module]]:
    """One attention module per layer of every role in ``stacks`` (the task's
    ``attention_stacks()``), e.g. ``{"encoder": 1, "decoder": 2, "cross": 2}`` for papers/002's
    translation model (one encoder block; two decoder blocks, each with a cross-attention) or
    ``{"decoder": n}`` for a causal LM. ``seq_len`` is one length for all roles or one per role
    (Super's fixed l: the source length for the encoder, the target length for the decoder).
    What the attentions cannot do is refused here with capability_problems' messages, before
    anything is built. Modules are built role by role in the order of ``stacks`` (parameter
    initialisation follows it)."""
    problems = capability_problems(model_cfg, stacks, requires)
    if problems:
        raise ValueError("; ".join(problems))
    lengths = seq_len if isinstance(seq_len, dict) else {role: seq_len for role in stacks}
    return {role: build_layer_attentions(model_cfg, n_layers, d_model, n_heads, lengths.get(role), grid, role)
            for role, n_layers in stacks.items()}
