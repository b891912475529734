"""JSON that other programs read: ``json.dumps`` writes a float that is not finite as ``NaN`` or
``Infinity``, which JSON does not have (RFC 8259 section 6): JavaScript's ``JSON.parse``, jq and
strict parsers refuse the whole file. Such a number is written as the string the records file
holds for it (``'nan'``, ``'inf'``, ``'-inf'``: ``repr``); everything else is as ``json.dumps``
writes it (strings escaped, non-ASCII as \\u escapes)."""
from __future__ import annotations

import json
import math


def portable(value):
    """``value`` with every non-finite float (in dicts, lists and tuples) as its ``repr``."""
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    if isinstance(value, dict):
        return {k: portable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [portable(v) for v in value]
    return value


def dumps(value, **kwargs) -> str:
    """``json.dumps`` of ``portable(value)``, refusing (ValueError) anything still not JSON."""
    return json.dumps(portable(value), allow_nan=False, **kwargs)
