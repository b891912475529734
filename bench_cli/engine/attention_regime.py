"""How an attention's kernel runs in the papers' efficiency regime, applied to a built model: in
float32 with autocast off, and under gradient checkpointing.

The kernel is what a ``ProjectedAttention`` computes between its projections (scores, softmax or
its replacement, the weighted values): the ``self.attn(Q, K, V, mask)`` of the LRA code the
Primal-Attention authors timed (yingyichen-cyy/PrimalAttention, PrimalAttention_LRA/PrimalFormer/ and
Primal.+Trans./, attentions/attention.py, lines 113-124 in both):

* under AMP the projections run in half precision, and the kernel in float32 with autocast off
  (``with torch.cuda.amp.autocast(enabled = False): ... self.attn(Q.float(), K.float(), ...)``,
  lines 114 and 120); their Primal layer likewise (lines 105-106; here models/attention/primal.py
  keeps its KSVD terms in float32 itself);
* the kernel of the attentions whose ``extra_attn_config`` says ``attention_grad_checkpointing``
  (Primal.+Trans./lra_config.py, lines 49-50 for ListOps: ``none`` and ``softmax``; lines 114-115,
  174-175, 239-240, 304-305 for the other tasks)
  runs under ``torch.utils.checkpoint`` (attention.py, line 122): its N x N scores are not kept
  for the backward but computed again, one layer at a time.

The wrapper is set on the module instance (its ``kernel`` attribute), so the weights, the state
dict and the class are untouched; a model built again is plain.
"""
from __future__ import annotations

import functools

import torch
import torch.nn as nn

__all__ = ["apply_attention_regime"]


def _float32_kernel(kernel, q, k, v, mask, causal):
    out_dtype = q.dtype
    with torch.autocast(q.device.type, enabled=False):
        out = kernel(q.float(), k.float(), v.float(), mask, causal)
    return out.to(out_dtype)


def _checkpointed_kernel(kernel, q, k, v, mask, causal):
    from torch.utils.checkpoint import checkpoint

    # use_reentrant=False: the non-reentrant form works with keyword arguments and inputs that do
    # not require grad; the RNG state is saved, so the recomputed dropout masks are the same.
    return checkpoint(kernel, q, k, v, mask, causal, use_reentrant=False)


def apply_attention_regime(model: nn.Module, *, float32: bool, checkpointed: bool) -> int:
    """Wrap the kernel of every ``ProjectedAttention`` in ``model``: in float32 with autocast off
    (``float32``), and under gradient checkpointing (``checkpointed``; inside the float32 cast,
    as the authors' code nests them). Returns how many attention layers were wrapped."""
    from attnbench.models.attention.base import ProjectedAttention

    if not (float32 or checkpointed):
        return 0
    layers = [m for m in model.modules() if isinstance(m, ProjectedAttention)]
    for layer in layers:
        kernel = type(layer).kernel.__get__(layer)
        if checkpointed:
            kernel = functools.partial(_checkpointed_kernel, kernel)
        if float32:
            kernel = functools.partial(_float32_kernel, kernel)
        layer.kernel = kernel
    return len(layers)
