"""The causal (decoder-only) transformer stack shared by the language model and the Decision
Transformer: pre-LayerNorm blocks run with ``causal=True`` and a final LayerNorm, as fairseq's
``transformer_lm`` (decoder_normalize_before, final layer_norm) and GPT-2 (ln_1/ln_2, ln_f) are.

The attentions come from the registry, one per layer (``models.roles.build_layer_attentions`` with
role ``decoder``), so Primal.+ -- Causal Primal-Attention in the last layer, supplement Listing 1 --
is a model-config choice. Right padding needs no mask here: under causal attention a padded
position never reaches an earlier (real) one.
"""
from __future__ import annotations

import torch
import torch.nn as nn

from attnbench.models.layers import EncoderLayer


class CausalDecoder(nn.Module):
    """(B, N, d) -> (B, N, d); output i depends on inputs 0..i only."""

    def __init__(self, attentions: list[nn.Module], d_model: int, d_ff: int, dropout: float = 0.1,
                 activation: str = "relu", activation_dropout: float = 0.0):
        super().__init__()
        self.layers = nn.ModuleList(
            EncoderLayer(a, d_model, d_ff, dropout, activation, "layer", norm_first=True,
                         activation_dropout=activation_dropout) for a in attentions)
        self.norm = nn.LayerNorm(d_model)  # eps 1e-5, as fairseq's LayerNorm and GPT-2's layer_norm_epsilon

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            h = layer(h, causal=True)
        return self.norm(h)


def build_causal_decoder(model_cfg, backbone: dict, seq_len: int) -> CausalDecoder:
    """The stack for a task's ``backbone`` (n_layers, d_model, n_heads, d_ff, dropout, activation,
    attention_dropout) around the attentions of ``model_cfg`` (role ``decoder``)."""
    from attnbench.models.roles import build_layer_attentions

    b = dict(backbone)
    d_model, n_layers = int(b["d_model"]), int(b["n_layers"])
    attentions = build_layer_attentions(model_cfg, n_layers, d_model, int(b["n_heads"]), seq_len, role="decoder",
                                       attention_dropout=b.get("attention_dropout"))
    return CausalDecoder(attentions, d_model, int(b["d_ff"]), float(b.get("dropout", 0.1)),
                         str(b.get("activation", "relu")), float(b.get("activation_dropout") or 0.0))
