"""Helpers the transcriptions share."""
from __future__ import annotations


def linear(t, layer):
    """nn.Linear written out: t W^T + b."""
    return t @ layer.weight.T + layer.bias
