"""Compact JSON for the hot paths (bus jobs, audit events): orjson, with the standard library's refusals.

orjson encodes a 384-float embedding in ~0.01 ms where ``json.dumps`` takes
~0.25 ms. It writes NaN and infinity as ``null`` instead of refusing them, so
output holding ``null`` is checked once more by the standard library, which
raises ``ValueError`` for them (a real None passes).
"""

from __future__ import annotations

import json
from typing import Any

import orjson


def dumps(data: Any, *, sort_keys: bool = False) -> bytes:
    """Compact JSON of plain finite data: ``ValueError`` for NaN or infinity, ``TypeError`` for anything else."""
    encoded = orjson.dumps(data, option=orjson.OPT_SORT_KEYS if sort_keys else None)
    if b"null" in encoded:
        json.dumps(data, allow_nan=False)
    return encoded


def canonical(data: Any) -> str:
    """Sorted keys, no spaces, no NaN: one text for one value."""
    return dumps(data, sort_keys=True).decode()
