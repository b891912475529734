"""Attention zoo: every variant of the three papers behind one interface.

``build_attention(name, d_model=..., n_heads=..., **options)`` returns an ``nn.Module`` whose
``forward(x, mask=None, causal=False)`` maps (batch, length, d_model) to the same shape;
``mask`` is a (batch, length) bool tensor, True for real tokens.

Modules whose capabilities have ``extra_loss=True`` (Primal-Attention) implement
``auxiliary_loss()``; ``collect_auxiliary_loss(model)`` sums it over a model.
"""
from models.attention.registry import (  # noqa: F401
    AttentionSpec,
    Capabilities,
    UnknownAttentionError,
    attention_spec,
    available_attentions,
    build_attention,
    register_attention,
)
from models.attention.base import collect_auxiliary_loss  # noqa: F401

# Importing the variant modules registers them.
from models.attention import softmax  # noqa: F401,E402
from models.attention import primal_dual  # noqa: F401,E402  attention/linear/sparse x {bn, sh, bn_sh}
from models.attention import conv  # noqa: F401,E402  conv1d, conv2d
from models.attention import better  # noqa: F401,E402  standard, optimised, efficient, super
from models.attention import primal  # noqa: F401,E402  primal
