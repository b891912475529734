"""Building blocks shared by the backbones: the encoder and decoder blocks and positional encodings."""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

_ACTIVATIONS = {"gelu": F.gelu, "relu": F.relu}


class AttentionShapeError(RuntimeError):
    """An attention returned another shape than its queries': a (B, 1, D) output would broadcast
    in the residual sum and train silently."""


def attend(attention: nn.Module, x: torch.Tensor, **inputs) -> torch.Tensor:
    """``attention(x, **inputs)``, whose output must have the queries' shape (batch, length,
    d_model). The check is one tuple comparison per call: nothing next to the attention itself."""
    out = attention(x, **inputs)
    if getattr(out, "shape", None) != x.shape:
        name = getattr(attention, "registered_name", type(attention).__name__)
        actual = tuple(out.shape) if hasattr(out, "shape") else type(out).__name__
        raise AttentionShapeError(f"attention '{name}' returned shape {actual}, expected {tuple(x.shape)} "
                                  "(the queries' (batch, length, d_model))")
    return out


class DropPath(nn.Module):
    """Stochastic depth (Huang et al. 2016) as timm's ``drop_path``: a residual branch is dropped for
    a whole sample with probability ``p`` and scaled by 1 / (1 - p) otherwise (training only)."""

    def __init__(self, p: float):
        super().__init__()
        self.p = float(p)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0.0:
            return x
        keep = 1.0 - self.p
        mask = x.new_empty((x.shape[0],) + (1,) * (x.dim() - 1)).bernoulli_(keep)
        return x * mask / keep


class EncoderLayer(nn.Module):
    """Attention + feed-forward block, post- or pre-norm, LayerNorm or BatchNorm (mvts_transformer).

    ``activation_dropout`` is the dropout on the feed-forward's hidden activations, between its two
    layers (None: ``dropout``; fairseq's transformer_lm, GPT-2 and keras' TransformerBlock use 0);
    ``drop_path``: stochastic depth on both residual branches (DeiT); ``norm_eps``: the LayerNorm
    epsilon (torch 1e-5; keras 1e-3, the keras-io text classifier 1e-6, ViT/DeiT 1e-6)."""

    def __init__(self, attention: nn.Module, d_model: int, d_ff: int, dropout: float = 0.1,
                 activation: str = "gelu", norm: str = "layer", norm_first: bool = False,
                 activation_dropout: float | None = None, norm_eps: float = 1e-5, drop_path: float = 0.0):
        super().__init__()
        self.attention = attention
        self.ff1, self.ff2 = nn.Linear(d_model, d_ff), nn.Linear(d_ff, d_model)
        self.dropout = nn.Dropout(dropout)
        self.dropout_ff = nn.Dropout(dropout if activation_dropout is None else activation_dropout)
        self.dropout1, self.dropout2 = nn.Dropout(dropout), nn.Dropout(dropout)
        self.activation = _ACTIVATIONS[activation]
        self.norm_kind, self.norm_first = norm, norm_first
        make = {"layer": lambda: nn.LayerNorm(d_model, eps=norm_eps),
                "batch": lambda: nn.BatchNorm1d(d_model, eps=norm_eps)}[norm]
        self.norm1, self.norm2 = make(), make()
        self.drop_path = DropPath(drop_path) if drop_path else nn.Identity()

    def _norm(self, norm: nn.Module, x: torch.Tensor) -> torch.Tensor:
        if self.norm_kind == "batch":  # BatchNorm1d normalises channels: (B, N, D) -> (B, D, N)
            return norm(x.transpose(1, 2)).transpose(1, 2)
        return norm(x)

    def _ff(self, x):
        return self.ff2(self.dropout_ff(self.activation(self.ff1(x))))

    def _residual(self, x, norm: nn.Module, dropout: nn.Module, sublayer) -> torch.Tensor:
        """One residual sublayer: x + DropPath(Drop(f(Norm(x)))) pre-norm, Norm(x + DropPath(Drop(f(x))))
        post-norm (DropPath is the identity unless ``drop_path`` is set)."""
        if self.norm_first:
            return x + self.drop_path(dropout(sublayer(self._norm(norm, x))))
        return self._norm(norm, x + self.drop_path(dropout(sublayer(x))))

    def forward(self, x, mask=None, causal=False):
        x = self._residual(x, self.norm1, self.dropout1, lambda h: attend(self.attention, h, mask=mask, causal=causal))
        return self._residual(x, self.norm2, self.dropout2, self._ff)


class DecoderLayer(EncoderLayer):
    """Causal self-attention, optional cross-attention over an encoded context, feed-forward.

    Post-norm (``norm_first=False``), the TransformerDecoder of keras-io's
    neural_machine_translation_with_transformer.py that papers/002's translation model builds on:
        x = LN_1(x + Drop(SelfAttn(x, causal)))
        x = LN_c(x + Drop(CrossAttn(x, context, context_mask)))      only with a cross-attention
        x = LN_2(x + Drop(FFN(x))),        FFN(x) = W_2 Drop_act(act(W_1 x))
    Pre-norm (``norm_first=True``), fairseq's TransformerDecoderLayer with normalize_before (the
    transformer_lm decoder, which has no cross-attention; with one, its encoder_attn_layer_norm):
        x = x + Drop(SelfAttn(LN_1(x), causal))
        x = x + Drop(CrossAttn(LN_c(x), context, context_mask))     only with a cross-attention
        x = x + Drop(FFN(LN_2(x)))
    A pre-norm stack's final LayerNorm (fairseq's after the last layer) belongs to the backbone.

    Dropout, as fairseq places it: ``dropout`` on each sublayer's output before the residual
    sum; ``activation_dropout`` (default: ``dropout``, as EncoderLayer) after the FFN's
    activation; dropout on the attention probabilities is the attention modules' own option.
    The keras example has no dropout inside the block (``dropout=0`` reproduces it).

    LayerNorm only: BatchNorm's training statistics would mix in later tokens. ``mask`` (B, N)
    marks the real target tokens (keys of the self-attention, queries of the cross-attention);
    ``context_mask`` (B, M) the real context tokens.
    """

    def __init__(self, self_attention: nn.Module, d_model: int, d_ff: int, dropout: float = 0.1,
                 activation: str = "gelu", norm_first: bool = False, cross_attention: nn.Module | None = None,
                 activation_dropout: float | None = None):
        super().__init__(self_attention, d_model, d_ff, dropout, activation, "layer", norm_first, activation_dropout)
        self.cross_attention = cross_attention
        if cross_attention is not None:
            self.norm_cross, self.dropout_cross = nn.LayerNorm(d_model), nn.Dropout(dropout)

    def forward(self, x, mask=None, context=None, context_mask=None):
        if (context is None) != (self.cross_attention is None):
            raise ValueError("DecoderLayer: a context is needed exactly when the layer has a cross-attention "
                             f"(cross-attention: {self.cross_attention is not None}, context: {context is not None})")
        x = self._residual(x, self.norm1, self.dropout1, lambda h: attend(self.attention, h, mask=mask, causal=True))
        if self.cross_attention is not None:
            x = self._residual(x, self.norm_cross, self.dropout_cross,
                               lambda h: attend(self.cross_attention, h, mask=mask, context=context,
                                                  context_mask=context_mask))
        return self._residual(x, self.norm2, self.dropout2, self._ff)


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
