"""Vision Transformer backbones (ViT, DeiT) around attention layers from the registry.

One model serves both families of experiments; the task config's size preset chooses:

- pay-better-attention's ViTs follow the keras-io example ``image_classification_with_vision_
  transformer.py`` (papers/002 Sec. 4: "implemented in Keras ... using the examples available at
  keras.io/examples with minor dataset-specific adjustments"): patches projected linearly plus a
  learned position embedding, pre-LayerNorm blocks (eps 1e-6) with a GELU MLP of width 2 d,
  dropout 0.1 in the blocks and none on the patch embeddings (``embed_dropout: 0``: the example
  adds the position embedding and goes straight into the first block), a final LayerNorm, then the
  pooled representation into an MLP head (``head_hidden``, dropout ``head_dropout``), Keras'
  initialisation (``init: keras``: Glorot-uniform Dense kernels, attention kernels shaped as
  MultiHeadAttention's, models.init);
- DeiT (Touvron et al. 2021, facebookresearch/deit = timm's VisionTransformer): a cls token, the
  position embedding over cls + patches, pre-LayerNorm blocks (eps 1e-6) with MLP width 4 d,
  stochastic depth (``drop_path``, linearly increasing over the blocks), dropout on the patch +
  position embeddings at the blocks' rate (timm's ``pos_drop``, ``embed_dropout: null`` = ``dropout``;
  DeiT's --drop 0 makes it 0), the cls token's final
  LayerNorm output into a linear head, normal(0.02) initialisation (``init: timm``).

Tokens: (image_size / patch_size)^2 patches in row-major order, plus the cls token first when
``cls_token``; :func:`token_count` is the l of Super attention (its W^A is l x l).

The block is models.layers.EncoderLayer with ``norm_first=True``. Known differences from the
keras example: its MLP applies GELU after the second dense layer too, and it has no dropout on the
attention output (attention dropout sits inside keras' MultiHeadAttention); here the MLP is
Linear-GELU-Dropout-Linear-Dropout and the attention output gets dropout like the other tasks'.
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn

from attnbench.models.init import keras_init_
from attnbench.models.layers import EncoderLayer


def token_count(image_size: int, patch_size: int, cls_token: bool) -> int:
    """Tokens that enter attention: patches (+ 1 for the cls token)."""
    if image_size % patch_size:
        raise ValueError(f"image_size {image_size} is not a multiple of patch_size {patch_size}")
    return (image_size // patch_size) ** 2 + int(bool(cls_token))


class PatchEmbedding(nn.Module):
    """Non-overlapping p x p patches, each projected to d_model: a Conv2d with stride p, the same
    linear map as keras' extract_patches + Dense and timm's PatchEmbed."""

    def __init__(self, in_channels: int, d_model: int, patch_size: int):
        super().__init__()
        self.proj = nn.Conv2d(in_channels, d_model, patch_size, stride=patch_size)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.proj(images).flatten(2).transpose(1, 2)  # (B, H/p * W/p, d), row-major


class VisionTransformer(nn.Module):
    """Images (B, C, H, W) -> class logits (B, n_classes)."""

    def __init__(self, attentions: list[nn.Module], *, image_size: int, patch_size: int, in_channels: int,
                 n_classes: int, d_model: int, d_ff: int, cls_token: bool = True, pooling: str = "cls",
                 head_hidden=(), head_dropout: float = 0.0, dropout: float = 0.0, drop_path: float = 0.0,
                 activation: str = "gelu", norm_eps: float = 1e-6, init: str = "timm",
                 embed_dropout: float | None = None):
        super().__init__()
        if pooling not in ("cls", "mean", "flatten"):
            raise ValueError(f"unknown pooling '{pooling}' (cls | mean | flatten)")
        if pooling == "cls" and not cls_token:
            raise ValueError("pooling 'cls' needs cls_token: true")
        self.pooling, self.image_size, self.patch_size = pooling, image_size, patch_size
        self.n_tokens = token_count(image_size, patch_size, cls_token)
        self.patch_embed = PatchEmbedding(in_channels, d_model, patch_size)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, d_model)) if cls_token else None
        self.pos_embed = nn.Parameter(torch.zeros(1, self.n_tokens, d_model))
        # Dropout on patch + position embeddings: timm's pos_drop at drop_rate (None: ``dropout``, as
        # DeiT); the keras ViT example has none (conf/task/vit.yaml sets embed_dropout 0).
        self.pos_drop = nn.Dropout(dropout if embed_dropout is None else embed_dropout)
        n = len(attentions)
        rates = [drop_path * i / max(n - 1, 1) for i in range(n)]  # timm's stochastic depth decay rule
        self.blocks = nn.ModuleList(
            EncoderLayer(a, d_model, d_ff, dropout, activation, "layer", True, drop_path=r, norm_eps=norm_eps)
            for a, r in zip(attentions, rates))
        self.norm = nn.LayerNorm(d_model, eps=norm_eps)
        width = d_model * (self.n_tokens if pooling == "flatten" else 1)
        layers: list[nn.Module] = [nn.Dropout(head_dropout)] if head_dropout else []
        for hidden in head_hidden:
            layers += [nn.Linear(width, int(hidden)), nn.GELU()] + ([nn.Dropout(head_dropout)] if head_dropout else [])
            width = int(hidden)
        layers.append(nn.Linear(width, n_classes))
        self.head = nn.Sequential(*layers)
        self.reset_parameters(init)

    def reset_parameters(self, init: str) -> None:
        """``timm``: DeiT/timm ViT (Linear weights trunc-normal 0.02, biases 0, LayerNorm 1/0, cls
        and position embeddings trunc-normal 0.02, the patch Conv2d at PyTorch's default). timm's
        ``trunc_normal_(std=.02)`` truncates at +-2 absolute, i.e. 100 standard deviations: the
        distribution of ``normal_(std=.02)``, which is drawn here (20 times faster on the CPU).
        ``keras``: the keras example's defaults (Dense and the patch projection Glorot-uniform over
        its fan-in p*p*C and fan-out d, biases 0, the position Embedding uniform(-0.05, 0.05)).
        The attention projections get the kernel shapes of Keras' MultiHeadAttention and every other
        Linear (MLP, head, Super's W^A) a Dense kernel's: models.init.keras_init_.
        Applied to every Linear of the model; other parameters (Conv2D kernels, BN's beta, Primal's
        W_e, W_r, Lambda) keep the registry's initialisation.
        Afterwards, a block whose attention sets ``block_init = "torch"`` (Primal-Attention with
        init=code) gets PyTorch's default Linear/LayerNorm init back: the authors' CV code
        (models_combo.py ``ComboVisionTransformer``) inserts its Primal block after timm's init."""
        if init not in ("timm", "keras"):
            raise ValueError(f"unknown init '{init}' (timm | keras)")
        if init == "keras":
            keras_init_(self)
        for m in self.modules():
            if init == "timm" and isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, std=0.02)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
            elif isinstance(m, nn.LayerNorm):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)
        if init == "timm":
            nn.init.normal_(self.pos_embed, std=0.02)
            if self.cls_token is not None:
                nn.init.normal_(self.cls_token, std=0.02)
        else:
            w = self.patch_embed.proj.weight  # (d, C, p, p): Dense(p*p*C -> d)
            bound = math.sqrt(6.0 / (w[0].numel() + w.shape[0]))
            nn.init.uniform_(w, -bound, bound)
            nn.init.zeros_(self.patch_embed.proj.bias)
            nn.init.uniform_(self.pos_embed, -0.05, 0.05)
            if self.cls_token is not None:
                nn.init.zeros_(self.cls_token)
        for block in self.blocks:
            if getattr(block.attention, "block_init", None) == "torch":
                for m in block.modules():
                    if isinstance(m, (nn.Linear, nn.LayerNorm)):
                        m.reset_parameters()

    def no_weight_decay(self) -> set[str]:
        """Parameters the optimiser leaves undecayed besides 1-D ones (timm's convention, used by
        the trainer's parameter groups): DeiT's pos_embed and cls_token."""
        return {"pos_embed", "cls_token"}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.patch_embed(x)
        if self.cls_token is not None:
            h = torch.cat([self.cls_token.expand(h.shape[0], -1, -1), h], dim=1)
        h = self.pos_drop(h + self.pos_embed)
        for block in self.blocks:
            h = block(h)
        h = self.norm(h)
        if self.pooling == "cls":
            h = h[:, 0]
        elif self.pooling == "mean":
            h = h.mean(1)
        else:
            h = h.flatten(1)
        return self.head(h)


BACKBONE_KEYS = ("image_size", "patch_size", "d_model", "n_layers", "n_heads", "d_ff", "cls_token", "pooling",
                 "head_hidden", "head_dropout", "dropout", "attention_dropout", "drop_path", "activation",
                 "norm_eps", "init", "embed_dropout")


def build_vision_transformer(model_cfg, backbone: dict, in_channels: int, n_classes: int,
                             grid: tuple[int, int] | None = None) -> VisionTransformer:
    """The ViT of ``backbone`` (the task's size preset, resolved) with the attentions of
    ``model_cfg`` (models.roles: ``attention`` in every block, ``final_attention`` in the last).
    Super attention's l is the token count; Conv2D attention gets the patch grid.
    ``attention_dropout`` (when not null) sets every attention's probability dropout (the keras
    example's MultiHeadAttention(dropout=0.1)), overriding ``model.attention.dropout``."""
    from omegaconf import OmegaConf

    from attnbench.models.roles import build_layer_attentions

    b = dict(backbone)
    unknown = sorted(set(b) - set(BACKBONE_KEYS) - {"size"})
    if unknown:
        raise TypeError(f"unknown vision backbone options: {', '.join(unknown)}")
    attention_dropout = b.get("attention_dropout")
    if attention_dropout is not None:
        model_cfg = OmegaConf.create(OmegaConf.to_container(model_cfg, resolve=True))
        for key in ("attention", "final_attention"):
            if model_cfg.get(key) is not None and "dropout" in model_cfg[key]:
                model_cfg[key].dropout = float(attention_dropout)
    image, patch = int(b["image_size"]), int(b["patch_size"])
    tokens = token_count(image, patch, bool(b["cls_token"]))
    side = image // patch
    attentions = build_layer_attentions(model_cfg, int(b["n_layers"]), int(b["d_model"]), int(b["n_heads"]),
                                        tokens, grid=grid or (side, side))
    return VisionTransformer(
        attentions, image_size=image, patch_size=patch, in_channels=in_channels, n_classes=n_classes,
        d_model=int(b["d_model"]), d_ff=int(b["d_ff"]), cls_token=bool(b["cls_token"]), pooling=str(b["pooling"]),
        head_hidden=[int(h) for h in b.get("head_hidden") or []], head_dropout=float(b.get("head_dropout") or 0.0),
        dropout=float(b.get("dropout") or 0.0), drop_path=float(b.get("drop_path") or 0.0),
        activation=str(b.get("activation", "gelu")), norm_eps=float(b.get("norm_eps", 1e-6)),
        init=str(b.get("init", "timm")),
        embed_dropout=None if b.get("embed_dropout") is None else float(b["embed_dropout"]))
