"""Softmax (scaled dot-product) attention, the baseline of all three papers."""
from __future__ import annotations

from attnbench.models.attention.base import ProjectedAttention, softmax_kernel
from attnbench.models.attention.registry import Capabilities, register_attention


# Plain cross-attention (Vaswani et al. Sec. 3.2.3): queries from x, keys/values from the context.
@register_attention("softmax", paper="Vaswani et al. 2017; primal-dual (papers/003)", equation="Eqn. 1-2",
                    capabilities=Capabilities(causal=True, padding_mask=True, cross=True))
class SoftmaxAttention(ProjectedAttention):
    """softmax(QK^T / sqrt(D)) V per head, fused SDPA kernel."""

    def kernel(self, q, k, v, mask, causal):
        p = self.dropout if self.training else 0.0
        return softmax_kernel(q, k, v, mask, causal, dropout_p=p)
