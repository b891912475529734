"""Causal language model: fairseq's ``transformer_lm`` (base architecture), which the Primal-Attention
WikiText-103 experiments train (supplement B.1, Table 5: "5+[1]", 8 heads of 64).

As fairseq builds it (models/transformer_lm.py ``base_lm_architecture``, TransformerDecoder):
token embedding N(0, d^-1/2) with a zero padding row, scaled by sqrt(d); fixed sinusoidal
positions (fairseq's formula: [sin | cos] halves, frequencies 10000^(-i/(d/2-1)), positions counted
from padding_idx + 1); dropout; 6 pre-LayerNorm blocks (ReLU FFN 2048, no activation dropout,
attention dropout 0) run causally with a final LayerNorm; output projection tied to the input
embedding (--share-decoder-input-output-embed), no bias.
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn

from attnbench.models.causal import CausalDecoder, build_causal_decoder


def fairseq_sinusoids(positions: torch.Tensor, dim: int) -> torch.Tensor:
    """fairseq SinusoidalPositionalEmbedding.get_embedding rows for integer ``positions``."""
    half = dim // 2
    freq = torch.exp(torch.arange(half, dtype=torch.float32, device=positions.device)
                     * -(math.log(10000.0) / (half - 1)))
    angles = positions.to(torch.float32)[:, None] * freq[None]
    emb = torch.cat([torch.sin(angles), torch.cos(angles)], dim=1)
    return nn.functional.pad(emb, (0, dim - 2 * half))


class TransformerLM(nn.Module):
    """Token ids (B, N) -> next-token logits (B, N, vocab)."""

    def __init__(self, vocab_size: int, padding_idx: int, decoder: CausalDecoder, d_model: int,
                 dropout: float = 0.1, scale_embedding: bool = True):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, d_model, padding_idx=padding_idx)
        nn.init.normal_(self.embed.weight, mean=0.0, std=d_model ** -0.5)
        with torch.no_grad():
            self.embed.weight[padding_idx].zero_()
        self.padding_idx, self.d_model = padding_idx, d_model
        self.scale = math.sqrt(d_model) if scale_embedding else 1.0
        self.dropout = nn.Dropout(dropout)
        self.decoder = decoder

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """Final-LayerNorm hidden states (B, N, d)."""
        positions = torch.arange(x.shape[1], device=x.device) + self.padding_idx + 1
        h = self.scale * self.embed(x.long()) + fairseq_sinusoids(positions, self.d_model)[None]
        return self.decoder(self.dropout(h))

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        return h @ self.embed.weight.T  # tied output projection

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.logits(self.features(x))


def build_lm(model_cfg, backbone, vocab_size: int, padding_idx: int, seq_len: int) -> TransformerLM:
    from omegaconf import OmegaConf

    b = OmegaConf.to_container(backbone, resolve=True) if not isinstance(backbone, dict) else dict(backbone)
    known = {"n_layers", "d_model", "n_heads", "d_ff", "dropout", "attention_dropout", "activation",
             "activation_dropout", "scale_embedding"}
    if set(b) - known:
        raise TypeError(f"unknown lm backbone options: {', '.join(sorted(set(b) - known))}")
    decoder = build_causal_decoder(model_cfg, b, seq_len)
    return TransformerLM(vocab_size, padding_idx, decoder, int(b["d_model"]), float(b.get("dropout", 0.1)),
                         bool(b.get("scale_embedding", True)))
