"""Keras' default initialisation of a built model, for the backbones that stand for Keras models
(papers/002's text classifier, translation model and ViT: the keras-io examples, Keras 3 with JAX).

Keras initialises a layer's kernel by its own shape, and glorot_uniform (VarianceScaling) draws
uniform(-b, b), b = sqrt(6 / (fan_in + fan_out)), with the fans of ``keras_fans``: a transcription
of keras/src/initializers/random_initializers.py ``compute_fans`` as it was when the paper ran
(Keras 3 before #22789, April 2026): a kernel of rank > 2 counts as a convolution kernel.

- Dense (feed-forward, heads, the ViT patch projection): kernel (in, out), bias zeros; the same
  bound as torch's xavier_uniform_ on the (out, in) weight.
- MultiHeadAttention: EinsumDense kernels of shape (d_model, heads, d_k) for query, key and value
  and (heads, d_v, d_model) for the output, biases zeros. Their fans are conv-like: (d, h, d_k)
  gives fan_in = h d, fan_out = d_k d; (h, d_v, d) gives fan_in = d_v h, fan_out = d h. The bound
  is therefore far below the per-(d, d) Glorot's (IMDB, h 4: 2.4x; translation, d 1024, h 1: 22x).
- Embedding: uniform(-0.05, 0.05) (keras' "uniform" embeddings_initializer).
- LayerNormalization: gamma ones, beta zeros.

Attention variants: every attention module's ``q_proj``, ``k_proj``, ``v_proj`` (input
projections) and ``out_proj`` (output projection) are initialised as MultiHeadAttention's
kernels with the module's ``n_heads``; the paper's Optimised / Efficient / Super attention keep
the kernels they have, shaped as Keras' layer's (their code is not public; the parameter counts of
its tables are MultiHeadAttention's minus the omitted kernels). Any other Linear, e.g. Super's
l x l alignment kernel W^A, is a Dense kernel. Parameters outside Linear / Embedding / LayerNorm
keep the registry's initialisation.
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn

from attnbench.models.attention.base import AttentionBase

KERAS_EMBEDDING_BOUND = 0.05  # keras.initializers.RandomUniform() default range
INPUT_PROJECTIONS = ("q_proj", "k_proj", "v_proj")  # EinsumDense "abc,cde->abde": kernel (d, h, d_k)
OUTPUT_PROJECTIONS = ("out_proj",)                  # EinsumDense "abcd,cde->abe": kernel (h, d_v, d)


def keras_fans(shape: tuple[int, ...]) -> tuple[int, int]:
    """(fan_in, fan_out) of a kernel shape as Keras' ``compute_fans``."""
    if len(shape) == 1:
        return shape[0], shape[0]
    if len(shape) == 2:
        return shape[0], shape[1]
    receptive_field = math.prod(shape[:-2])
    return shape[-2] * receptive_field, shape[-1] * receptive_field


def glorot_bound(shape: tuple[int, ...]) -> float:
    fan_in, fan_out = keras_fans(shape)
    return math.sqrt(6.0 / (fan_in + fan_out))


def attention_kernel_shapes(model: nn.Module) -> dict[int, tuple[int, ...]]:
    """id of each attention projection Linear -> the shape Keras' MultiHeadAttention gives its kernel."""
    shapes: dict[int, tuple[int, ...]] = {}
    for attention in model.modules():
        if not isinstance(attention, AttentionBase):
            continue
        h = attention.n_heads
        for name in INPUT_PROJECTIONS + OUTPUT_PROJECTIONS:
            linear = getattr(attention, name, None)
            if not isinstance(linear, nn.Linear):
                continue
            d_out, d_in = linear.weight.shape
            shapes[id(linear)] = (d_in, h, d_out // h) if name in INPUT_PROJECTIONS else (h, d_in // h, d_out)
    return shapes


@torch.no_grad()
def keras_init_(model: nn.Module) -> nn.Module:
    """Keras' defaults on every Linear, Embedding and LayerNorm of ``model`` (module docstring),
    drawn in module order."""
    attention_shapes = attention_kernel_shapes(model)
    for m in model.modules():
        if isinstance(m, nn.Linear):
            d_out, d_in = m.weight.shape
            bound = glorot_bound(attention_shapes.get(id(m), (d_in, d_out)))
            m.weight.uniform_(-bound, bound)
            if m.bias is not None:
                m.bias.zero_()
        elif isinstance(m, nn.Embedding):
            m.weight.uniform_(-KERAS_EMBEDDING_BOUND, KERAS_EMBEDDING_BOUND)
        elif isinstance(m, nn.LayerNorm) and m.elementwise_affine:
            m.weight.fill_(1.0)
            if m.bias is not None:
                m.bias.zero_()
    return model
