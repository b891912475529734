"""Text backbones of papers/002 (Sec. 4.2, Appendix B.4), after the keras-io examples it built on.

``TextClassifier`` -- keras-io ``text_classification_with_transformer.py``: token + learned position
embeddings, post-LayerNorm transformer blocks (attention -> dropout -> LN(x + .), Dense relu ->
Dense -> dropout -> LN(x + .), epsilon 1e-6), global average pooling, Dropout(0.1) -> Dense(20,
relu) -> Dropout(0.1) -> Dense(classes). The paper: IMDB 1 layer, d_model = context length = 32;
Amazon 3 layers, d_model = context length = 64.

``TranslationTransformer`` -- keras-io ``neural_machine_translation_with_transformer.py``: source
and target PositionalEmbeddings (token + learned position), post-LayerNorm encoder blocks
(epsilon 1e-3, no dropout), decoder blocks (causal self-attention, cross-attention over the
encoded source, FFN; models.layers.DecoderLayer), Dropout(0.5), Dense(target vocabulary). The
paper (B.4.2): 1 encoder and 2 decoder blocks, d_model 1024. Masks: the encoder's and the
cross-attention's keys are the real source tokens, the decoder's self-attention is causal. (The
keras example builds the cross-attention mask from the decoder's own padding and the causal
mask -- a known slip of the example; the source padding mask is used here.)

``greedy_decode``: the example's ``decode_sequence`` for a batch: [start], then the argmax token
appended until [end] or ``max_len`` tokens.

Attention layers come from the registry by role (``models.roles``), one per layer.
"""
from __future__ import annotations

import torch
import torch.nn as nn

from attnbench.models.init import keras_init_
from attnbench.models.layers import DecoderLayer, EncoderLayer


class TokenAndPositionEmbedding(nn.Module):
    """keras-io ``TokenAndPositionEmbedding`` / ``PositionalEmbedding``: token embedding plus a
    learned embedding of the position 0..n-1."""

    def __init__(self, vocab_size: int, max_len: int, d_model: int):
        super().__init__()
        self.token = nn.Embedding(vocab_size, d_model)
        self.position = nn.Embedding(max_len, d_model)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        n = ids.shape[1]
        if n > self.position.num_embeddings:
            raise ValueError(f"sequence of length {n} exceeds the {self.position.num_embeddings} learned positions")
        return self.token(ids.long()) + self.position(torch.arange(n, device=ids.device))


INITS = ("keras", "torch")


def initialise(module: nn.Module, init: str) -> nn.Module:
    """``keras``: the examples' Keras defaults on the whole model, attention kernels shaped as
    MultiHeadAttention's (models.init); ``torch``: PyTorch's layer defaults as built."""
    if init == "keras":
        return keras_init_(module)
    if init != "torch":
        raise ValueError(f"unknown init '{init}' ({' | '.join(INITS)})")
    return module


class TextClassifier(nn.Module):
    """Embeddings -> transformer blocks -> average pooling -> the keras example's head."""

    def __init__(self, vocab_size: int, max_len: int, attentions: list[nn.Module], d_model: int, d_ff: int,
                 n_classes: int, dropout: float = 0.1, activation: str = "relu", norm_eps: float = 1e-6,
                 head_hidden: int = 20, head_dropout: float = 0.1):
        super().__init__()
        self.embedding = TokenAndPositionEmbedding(vocab_size, max_len, d_model)
        self.layers = nn.ModuleList(
            EncoderLayer(a, d_model, d_ff, dropout=dropout, activation=activation, norm="layer", norm_first=False,
                         norm_eps=norm_eps, activation_dropout=0.0)
            for a in attentions)
        self.head = nn.Sequential(nn.Dropout(head_dropout), nn.Linear(d_model, head_hidden), nn.ReLU(),
                                  nn.Dropout(head_dropout), nn.Linear(head_hidden, n_classes))

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        h = self.embedding(x)
        for layer in self.layers:
            h = layer(h, mask=mask)
        if mask is None:  # keras GlobalAveragePooling1D without a mask: every position, padding included
            pooled = h.mean(1)
        else:
            w = mask.unsqueeze(-1).to(h.dtype)
            pooled = (h * w).sum(1) / w.sum(1).clamp_min(1.0)
        return self.head(pooled)


def _backbone(backbone) -> dict:
    from omegaconf import OmegaConf

    return dict(OmegaConf.to_container(backbone, resolve=True)) if not isinstance(backbone, dict) else dict(backbone)


def build_text_classifier(model_cfg, backbone, vocab_size: int, max_len: int, n_classes: int) -> TextClassifier:
    """The classifier of ``backbone`` (n_layers, d_model, n_heads, d_ff, dropout, activation,
    norm_eps, head_hidden, head_dropout, init) with the attention of ``model_cfg`` in every layer;
    Super attention's l is ``max_len`` (the padded length)."""
    from attnbench.models.roles import build_layer_attentions

    b = _backbone(backbone)
    n_layers, n_heads, d_model = int(b.pop("n_layers")), int(b.pop("n_heads")), int(b.pop("d_model"))
    init = str(b.pop("init", "keras"))
    options = {k: b.pop(k) for k in ("d_ff", "dropout", "activation", "norm_eps", "head_hidden", "head_dropout") if k in b}
    if b:
        raise TypeError(f"unknown text classifier options: {', '.join(sorted(b))}")
    attentions = build_layer_attentions(model_cfg, n_layers, d_model, n_heads, max_len)
    model = TextClassifier(vocab_size, max_len, attentions, d_model, n_classes=n_classes, **options)
    return initialise(model, init)



def set_layer_norm_eps_(module: nn.Module, eps: float) -> None:
    """Every LayerNorm of ``module`` gets epsilon ``eps`` (keras' LayerNormalization default is
    1e-3; models.layers.DecoderLayer builds torch's 1e-5 and takes no epsilon)."""
    for m in module.modules():
        if isinstance(m, nn.LayerNorm):
            m.eps = eps


class TranslationTransformer(nn.Module):
    """Encoder-decoder transformer of the keras-io translation example (see the module doc)."""

    def __init__(self, src_vocab: int, tgt_vocab: int, src_len: int, tgt_len: int, attentions: dict[str, list],
                 d_model: int, d_ff: int, dropout: float = 0.0, output_dropout: float = 0.5,
                 activation: str = "relu", norm_eps: float = 1e-3):
        super().__init__()
        self.src_embedding = TokenAndPositionEmbedding(src_vocab, src_len, d_model)
        self.tgt_embedding = TokenAndPositionEmbedding(tgt_vocab, tgt_len, d_model)
        self.encoder = nn.ModuleList(
            EncoderLayer(a, d_model, d_ff, dropout=dropout, activation=activation, norm="layer", norm_first=False,
                         norm_eps=norm_eps, activation_dropout=0.0)
            for a in attentions["encoder"])
        self.decoder = nn.ModuleList(
            DecoderLayer(s, d_model, d_ff, dropout=dropout, activation=activation, norm_first=False,
                         cross_attention=c, activation_dropout=0.0)
            for s, c in zip(attentions["decoder"], attentions["cross"], strict=True))
        set_layer_norm_eps_(self.decoder, norm_eps)
        self.output_dropout = nn.Dropout(output_dropout)
        self.output = nn.Linear(d_model, tgt_vocab)

    def encode(self, src: torch.Tensor, src_mask: torch.Tensor | None = None) -> torch.Tensor:
        h = self.src_embedding(src)
        for layer in self.encoder:
            h = layer(h, mask=src_mask)
        return h

    def decode(self, tgt: torch.Tensor, memory: torch.Tensor, src_mask: torch.Tensor | None = None,
               tgt_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Next-token logits (B, T, target vocabulary) at every target position."""
        h = self.tgt_embedding(tgt)
        for layer in self.decoder:
            h = layer(h, mask=tgt_mask, context=memory, context_mask=src_mask)
        return self.output(self.output_dropout(h))

    def forward(self, src, tgt, src_mask=None, tgt_mask=None):
        return self.decode(tgt, self.encode(src, src_mask), src_mask, tgt_mask)


@torch.no_grad()
def greedy_decode(model: TranslationTransformer, src: torch.Tensor, src_mask: torch.Tensor | None,
                  start_id: int, end_id: int, max_len: int) -> list[list[int]]:
    """Greedy decoding of a batch (eval mode is the caller's): per sentence the generated ids
    after [start], up to and excluding [end] (at most ``max_len`` generated tokens)."""
    memory = model.encode(src, src_mask)
    out = torch.full((src.shape[0], 1), start_id, dtype=torch.long, device=src.device)
    done = torch.zeros(src.shape[0], dtype=torch.bool, device=src.device)
    for _ in range(max_len):
        nxt = model.decode(out, memory, src_mask)[:, -1].argmax(-1)
        nxt = nxt.masked_fill(done, 0)  # finished sentences are padded
        out = torch.cat([out, nxt[:, None]], dim=1)
        done |= nxt == end_id
        if bool(done.all()):
            break
    result = []
    for row in out[:, 1:].tolist():
        result.append(row[: row.index(end_id)] if end_id in row else row)
    return result


def build_translation_model(model_cfg, backbone, src_vocab: int, tgt_vocab: int, src_len: int, tgt_len: int,
                            stacks: dict[str, int]) -> TranslationTransformer:
    """The translation model of ``backbone`` (d_model, n_heads, d_ff, dropout, output_dropout,
    activation, norm_eps, init; the layer counts come as the task's ``stacks``) with the
    attentions of ``model_cfg`` in every role: encoder self-attention, causal decoder
    self-attention, cross-attention (models.roles.build_role_attentions)."""
    from attnbench.models.roles import build_role_attentions

    b = _backbone(backbone)
    for k in ("n_encoder_layers", "n_decoder_layers"):
        b.pop(k, None)
    n_heads, d_model, init = int(b.pop("n_heads")), int(b.pop("d_model")), str(b.pop("init", "keras"))
    options = {k: b.pop(k) for k in ("d_ff", "dropout", "output_dropout", "activation", "norm_eps") if k in b}
    if b:
        raise TypeError(f"unknown translation model options: {', '.join(sorted(b))}")
    attentions = build_role_attentions(model_cfg, stacks, d_model, n_heads,
                                       {"encoder": src_len, "decoder": tgt_len, "cross": src_len})
    model = TranslationTransformer(src_vocab, tgt_vocab, src_len, tgt_len, attentions, d_model, **options)
    return initialise(model, init)
