"""Backbones built around attention layers taken from the registry by name.

Each backbone receives one attention module per layer, so architectures such as Primal.+
(softmax everywhere but the last layer; Primal-Attention supplement, Table 5) are a config choice.
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from omegaconf import DictConfig, OmegaConf

from models.attention import attention_spec, build_attention

_ACTIVATIONS = {"gelu": F.gelu, "relu": F.relu}


def _options(cfg) -> dict:
    if isinstance(cfg, DictConfig):
        cfg = OmegaConf.to_container(cfg, resolve=True)
    return dict(cfg or {})


def layer_attention_configs(model_cfg, n_layers: int) -> list[dict]:
    """Per-layer attention config: ``model.attention`` everywhere, ``model.final_attention`` last."""
    base = _options(model_cfg.attention)
    final = _options(model_cfg.get("final_attention"))
    configs = [dict(base) for _ in range(n_layers)]
    if final:
        configs[-1] = final
    return configs


def build_layer_attentions(model_cfg, n_layers: int, d_model: int, n_heads: int, seq_len: int | None,
                           grid: tuple[int, int] | None = None) -> list[nn.Module]:
    """One attention module per layer. ``grid`` is the task's 2D token layout (image patches);
    sequence tasks have none, and a variant that needs one (Conv2D) then sees the sequence as a
    1 x N grid, where its (k_h, k_w) kernel acts along the sequence only (documented in README)."""
    modules = []
    for options in layer_attention_configs(model_cfg, n_layers):
        name = options.pop("name")
        caps = attention_spec(name).capabilities
        if not caps.variable_length and options.get("max_len") is None:
            options["max_len"] = seq_len  # Super attention's W^A is l x l for the task's context length
        if caps.needs_grid and options.get("grid") is None:
            options["grid"] = grid if grid is not None else (1, seq_len)
        modules.append(build_attention(name, d_model=d_model, n_heads=n_heads, **options))
    return modules


def required_capabilities_missing(model_cfg, n_layers: int, requires: dict[str, bool]) -> list[str]:
    """Names of capabilities the task requires that some layer's attention lacks."""
    missing = []
    for options in layer_attention_configs(model_cfg, n_layers):
        caps = attention_spec(options["name"]).capabilities
        missing += [f"{options['name']}: {cap}" for cap, needed in requires.items() if needed and not getattr(caps, cap)]
    return sorted(set(missing))


class EncoderLayer(nn.Module):
    """Attention + feed-forward block, post- or pre-norm, LayerNorm or BatchNorm (mvts_transformer)."""

    def __init__(self, attention: nn.Module, d_model: int, d_ff: int, dropout: float = 0.1,
                 activation: str = "gelu", norm: str = "layer", norm_first: bool = False):
        super().__init__()
        self.attention = attention
        self.ff1, self.ff2 = nn.Linear(d_model, d_ff), nn.Linear(d_ff, d_model)
        self.dropout, self.dropout_ff = nn.Dropout(dropout), nn.Dropout(dropout)
        self.dropout1, self.dropout2 = nn.Dropout(dropout), nn.Dropout(dropout)
        self.activation = _ACTIVATIONS[activation]
        self.norm_kind, self.norm_first = norm, norm_first
        make = {"layer": lambda: nn.LayerNorm(d_model), "batch": lambda: nn.BatchNorm1d(d_model, eps=1e-5)}[norm]
        self.norm1, self.norm2 = make(), make()

    def _norm(self, norm: nn.Module, x: torch.Tensor) -> torch.Tensor:
        if self.norm_kind == "batch":  # BatchNorm1d normalises channels: (B, N, D) -> (B, D, N)
            return norm(x.transpose(1, 2)).transpose(1, 2)
        return norm(x)

    def _ff(self, x):
        return self.ff2(self.dropout_ff(self.activation(self.ff1(x))))

    def forward(self, x, mask=None, causal=False):
        if self.norm_first:
            x = x + self.dropout1(self.attention(self._norm(self.norm1, x), mask=mask, causal=causal))
            return x + self.dropout2(self._ff(self._norm(self.norm2, x)))
        x = self._norm(self.norm1, x + self.dropout1(self.attention(x, mask=mask, causal=causal)))
        return self._norm(self.norm2, x + self.dropout2(self._ff(x)))


class PositionalEncoding(nn.Module):
    """Learnable (mvts_transformer: uniform(-0.02, 0.02)) or fixed sinusoidal, plus dropout."""

    def __init__(self, d_model: int, max_len: int, kind: str = "learnable", dropout: float = 0.1):
        super().__init__()
        self.dropout = nn.Dropout(dropout)
        if kind == "learnable":
            self.pe = nn.Parameter(torch.empty(max_len, d_model).uniform_(-0.02, 0.02))
        elif kind == "fixed":
            pos = torch.arange(max_len).unsqueeze(1)
            div = torch.exp(torch.arange(0, d_model, 2) * (-math.log(10000.0) / d_model))
            pe = torch.zeros(max_len, d_model)
            pe[:, 0::2], pe[:, 1::2] = torch.sin(pos * div), torch.cos(pos * div)[:, : d_model // 2]
            self.register_buffer("pe", pe)
        else:
            raise ValueError(f"unknown pos_encoding '{kind}' (learnable | fixed)")

    def forward(self, x):
        return self.dropout(x + self.pe[: x.shape[1]])


class TimeSeriesTransformer(nn.Module):
    """Zerveas et al. 2021 encoder classifier: input projection * sqrt(d), positional encoding,
    encoder layers, GELU + dropout, padded steps zeroed, then flatten (or mean) into a linear head."""

    def __init__(self, in_channels: int, n_classes: int, max_len: int, attentions: list[nn.Module],
                 d_model: int, d_ff: int, dropout: float = 0.1, activation: str = "gelu",
                 norm: str = "batch", norm_first: bool = False, pos_encoding: str = "learnable",
                 pooling: str = "flatten", **unused):
        super().__init__()
        if unused:
            raise TypeError(f"unknown backbone options: {', '.join(sorted(unused))}")
        self.d_model, self.pooling, self.max_len = d_model, pooling, max_len
        self.input_proj = nn.Linear(in_channels, d_model)
        self.pos = PositionalEncoding(d_model, max_len, pos_encoding, dropout)
        self.layers = nn.ModuleList(
            EncoderLayer(a, d_model, d_ff, dropout, activation, norm, norm_first) for a in attentions
        )
        self.activation = _ACTIVATIONS[activation]
        self.dropout = nn.Dropout(dropout)
        width = d_model * max_len if pooling == "flatten" else d_model
        if pooling not in ("flatten", "mean"):
            raise ValueError(f"unknown pooling '{pooling}' (flatten | mean)")
        self.head = nn.Linear(width, n_classes)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        h = self.pos(self.input_proj(x) * math.sqrt(self.d_model))
        for layer in self.layers:
            h = layer(h, mask=mask)
        h = self.dropout(self.activation(h))
        if mask is not None:
            h = h * mask.unsqueeze(-1)
        if self.pooling == "flatten":
            return self.head(h.reshape(h.shape[0], -1))
        denom = mask.sum(1, keepdim=True).clamp(min=1) if mask is not None else h.shape[1]
        return self.head(h.sum(1) / denom)
