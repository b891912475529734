"""The time-series backbone of mvts_transformer (Zerveas et al. 2021): UEA classification, TSER regression."""
from __future__ import annotations

import math

import torch
import torch.nn as nn

from attnbench.models.layers import _ACTIVATIONS, EncoderLayer, PositionalEncoding


class TimeSeriesTransformer(nn.Module):
    """Zerveas et al. 2021 encoder classifier: input projection * sqrt(d), positional encoding,
    encoder layers, GELU + dropout, padded steps zeroed, then flatten (or mean) into a linear head.

    Options for the Primal-Attention UEA code (PrimalAttention_TimeSeries, built on Flowformer's
    encoder); the defaults are mvts_transformer's (no final norm, the mask passed to attention):
    ``final_norm``: a LayerNorm after the last encoder layer (their ``Encoder(norm_layer=LayerNorm)``);
    ``attention_mask``: false passes no padding mask to the attention layers (their encoder never
    does: padded steps are keys of the softmax and rows/terms of Primal); the head still zeroes them."""

    def __init__(self, in_channels: int, n_classes: int, max_len: int, attentions: list[nn.Module],
                 d_model: int, d_ff: int, dropout: float = 0.1, activation: str = "gelu",
                 norm: str = "batch", norm_first: bool = False, pos_encoding: str = "learnable",
                 pooling: str = "flatten", final_norm: bool = False, attention_mask: bool = True, **unused):
        super().__init__()
        if unused:
            raise TypeError(f"unknown backbone options: {', '.join(sorted(unused))}")
        self.d_model, self.pooling, self.max_len = d_model, pooling, max_len
        self.attention_mask = bool(attention_mask)
        self.input_proj = nn.Linear(in_channels, d_model)
        self.pos = PositionalEncoding(d_model, max_len, pos_encoding, dropout)
        self.layers = nn.ModuleList(
            EncoderLayer(a, d_model, d_ff, dropout, activation, norm, norm_first) for a in attentions
        )
        self.final_norm = nn.LayerNorm(d_model) if final_norm else None
        self.activation = _ACTIVATIONS[activation]
        self.dropout = nn.Dropout(dropout)
        width = d_model * max_len if pooling == "flatten" else d_model
        if pooling not in ("flatten", "mean"):
            raise ValueError(f"unknown pooling '{pooling}' (flatten | mean)")
        self.head = nn.Linear(width, n_classes)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        h = self.pos(self.input_proj(x) * math.sqrt(self.d_model))
        attention_mask = mask if self.attention_mask else None
        for layer in self.layers:
            h = layer(h, mask=attention_mask)
        if self.final_norm is not None:
            h = self.final_norm(h)
        h = self.dropout(self.activation(h))
        if mask is not None:
            h = h * mask.unsqueeze(-1)
        if self.pooling == "flatten":
            return self.head(h.reshape(h.shape[0], -1))
        denom = mask.sum(1, keepdim=True).clamp(min=1) if mask is not None else h.shape[1]
        return self.head(h.sum(1) / denom)
