"""Attention zoo: every variant of the three papers behind one interface.

``build_attention(name, d_model=..., n_heads=..., **options)`` returns an ``nn.Module`` whose
``forward(x, mask=None, causal=False)`` maps (batch, length, d_model) to the same shape;
``mask`` is a (batch, length) bool tensor, True for real tokens.

Variants with ``capabilities.cross`` also take ``forward(x, mask, context=C, context_mask=M)``:
queries from x, keys and values from the context C (batch, length_c, d_model) with its own
padding mask M (batch, length_c); ``mask`` then only marks padded queries. ``causal=True`` with
a context is a ValueError (a decoder's cross-attention sees the whole source).

Modules whose capabilities have ``extra_loss=True`` (Primal-Attention) implement
``auxiliary_loss()``; ``collect_auxiliary_loss(model, layers)`` sums or averages it over a model's
layers; ``accumulate_auxiliary_losses(model)`` groups the passes of a model that runs shared layers twice.
"""
from attnbench.models.attention.registry import (  # noqa: F401
    ATTENTIONS,
    AttentionSpec,
    Capabilities,
    attention_spec,
    available_attentions,
    build_attention,
    register_attention,
)
from attnbench.models.attention.base import ProjectedAttention, accumulate_auxiliary_losses, collect_auxiliary_loss  # noqa: F401

# Importing the variant modules registers them.
from attnbench.models.attention import softmax  # noqa: F401,E402
from attnbench.models.attention import primal_dual  # noqa: F401,E402  attention/linear/sparse x {bn, sh, bn_sh}
from attnbench.models.attention import conv  # noqa: F401,E402  conv1d, conv2d
from attnbench.models.attention import better  # noqa: F401,E402  standard, optimised, efficient, super
from attnbench.models.attention import primal  # noqa: F401,E402  primal
# The baselines of the Primal-Attention tables (papers/004 Tables 1, 3-5, 7b), each as the code
# behind the published numbers.
from attnbench.models.attention import linformer  # noqa: F401,E402
from attnbench.models.attention import nystromformer  # noqa: F401,E402
from attnbench.models.attention import performer  # noqa: F401,E402
from attnbench.models.attention import reformer  # noqa: F401,E402
from attnbench.models.attention import longformer  # noqa: F401,E402
from attnbench.models.attention import yoso  # noqa: F401,E402  yoso_e
from attnbench.models.attention import cosformer  # noqa: F401,E402
from attnbench.models.attention import soft  # noqa: F401,E402
from attnbench.models.attention import flowformer  # noqa: F401,E402
