"""Long Range Arena backbones: the encoder classifier and the retrieval dual encoder.

Architecture of the PyTorch LRA code the papers used (Nystromformer ``LRA/code/model.py`` and
``model_wrapper.py``, reused by Transformer-LS; primal-dual Appendix A.2, Primal-Attention
supplement Table 5): token embedding + learned position embedding (both N(0, 0.02)), dropout,
pre-LayerNorm encoder layers (GELU feed-forward), a final LayerNorm whose output is zeroed at
padded positions, mean pooling over the (padded) length, and an MLP head
``Linear(d, d_ff) -> ReLU -> Linear(d_ff, classes)``. The retrieval model encodes both documents
with the same encoder and classifies ``[u, v, u * v, u - v]``.

Attention layers come from the registry (``models.roles.build_layer_attentions``), one per
layer, so Primal.+ (softmax then Primal) is a model-config choice.
"""
from __future__ import annotations

import torch
import torch.nn as nn

from attnbench.models.attention import accumulate_auxiliary_losses
from attnbench.models.layers import EncoderLayer


class LRAEmbedding(nn.Module):
    def __init__(self, vocab_size: int, d_model: int, max_len: int, dropout: float):
        super().__init__()
        self.tokens = nn.Embedding(vocab_size, d_model)
        self.positions = nn.Embedding(max_len, d_model)
        nn.init.normal_(self.tokens.weight, std=0.02)
        nn.init.normal_(self.positions.weight, std=0.02)
        self.dropout = nn.Dropout(dropout)
        self.max_len = max_len

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        n = ids.shape[1]
        if n > self.max_len:
            raise ValueError(f"sequence of length {n} exceeds the position embedding ({self.max_len})")
        pos = torch.arange(n, device=ids.device)
        return self.dropout(self.tokens(ids.long()) + self.positions(pos)[None])


class LRAEncoder(nn.Module):
    """Token ids (B, N) [+ mask (B, N), True on real tokens] -> pooled features (B, d_model)."""

    def __init__(self, vocab_size: int, max_len: int, attentions: list[nn.Module], d_model: int, d_ff: int,
                 dropout: float = 0.1, activation: str = "gelu", norm_first: bool = True, pooling: str = "mean"):
        super().__init__()
        if pooling not in ("mean", "masked_mean"):
            raise ValueError(f"unknown pooling '{pooling}' (mean | masked_mean)")
        self.pooling = pooling
        self.embed = LRAEmbedding(vocab_size, d_model, max_len, dropout)
        self.layers = nn.ModuleList(
            EncoderLayer(a, d_model, d_ff, dropout, activation, "layer", norm_first) for a in attentions
        )
        self.norm = nn.LayerNorm(d_model)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        h = self.embed(x)
        for layer in self.layers:
            h = layer(h, mask=mask)
        h = self.norm(h)
        if mask is None:
            return h.mean(1)
        h = h * mask.unsqueeze(-1).to(h.dtype)
        if self.pooling == "mean":  # the LRA code: padded positions count in the mean (as zeros)
            return h.mean(1)
        return h.sum(1) / mask.sum(1, keepdim=True).clamp(min=1).to(h.dtype)


def _head(width: int, d_ff: int, n_classes: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(width, d_ff), nn.ReLU(), nn.Linear(d_ff, n_classes))


class LRAClassifier(nn.Module):
    """ListOps, Text, Image, Pathfinder: one sequence -> class logits."""

    def __init__(self, encoder: LRAEncoder, d_model: int, d_ff: int, n_classes: int):
        super().__init__()
        self.encoder = encoder
        self.head = _head(d_model, d_ff, n_classes)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        return self.head(self.encoder(x, mask))


class LRADualEncoder(nn.Module):
    """Retrieval: both documents through the same encoder (shared weights), then an MLP on
    ``[u, v, u * v, u - v]``; auxiliary losses (Primal's KSVD) cover both passes."""

    def __init__(self, encoder: LRAEncoder, d_model: int, d_ff: int, n_classes: int = 2):
        super().__init__()
        self.encoder = encoder
        self.head = _head(4 * d_model, d_ff, n_classes)

    def forward(self, x1: torch.Tensor, x2: torch.Tensor, mask1: torch.Tensor | None = None,
                mask2: torch.Tensor | None = None) -> torch.Tensor:
        # Both passes feed one auxiliary loss (Primal's KSVD terms averaged over the two documents
        # before the square, as the LRA code's ModelForSCDual); otherwise the second would replace the first.
        with accumulate_auxiliary_losses(self.encoder):
            u = self.encoder(x1, mask1)
            v = self.encoder(x2, mask2)
        return self.head(torch.cat([u, v, u * v, u - v], dim=-1))


def build_lra_model(model_cfg, backbone, vocab_size: int, max_len: int, n_classes: int, dual: bool = False,
                    grid: tuple[int, int] | None = None) -> nn.Module:
    """The LRA model for ``backbone`` (task config) around the attentions of ``model_cfg``.

    ``backbone.attention_dropout`` (when not null) sets the attention-probability dropout of every
    layer, as the LRA code's ``attention_dropout`` does, overriding ``model.attention.dropout``.
    """
    from omegaconf import OmegaConf

    from attnbench.models.roles import build_layer_attentions

    b = dict(OmegaConf.to_container(backbone, resolve=True)) if not isinstance(backbone, dict) else dict(backbone)
    n_layers, n_heads = int(b.pop("n_layers")), int(b.pop("n_heads"))
    attention_dropout = b.pop("attention_dropout", None)
    d_model, d_ff = int(b.pop("d_model")), int(b.pop("d_ff"))
    options = {k: b.pop(k) for k in ("dropout", "activation", "norm_first", "pooling") if k in b}
    if b:
        raise TypeError(f"unknown LRA backbone options: {', '.join(sorted(b))}")
    attentions = build_layer_attentions(model_cfg, n_layers, d_model, n_heads, max_len, grid=grid,
                                        attention_dropout=attention_dropout)
    encoder = LRAEncoder(vocab_size, max_len, attentions, d_model, d_ff, **options)
    if dual:
        return LRADualEncoder(encoder, d_model, d_ff, n_classes)
    return LRAClassifier(encoder, d_model, d_ff, n_classes)
