"""Compact JSON for the hot paths (bus jobs, audit events): orjson, with the standard library's refusals.

orjson is the encoder (far cheaper than ``json.dumps`` for an embedding;
``bench/RESULTS.md``). Where the two differ, this keeps what
``json.dumps(allow_nan=False)`` accepts and refuses:

- NaN and infinity: orjson writes them as ``null``, so output holding
  ``null`` is checked once more by the standard library, which raises
  ``ValueError`` for them (a real None passes);
- float subclasses (``numpy.float64`` from ``list(array)``) are written as
  floats; datetimes and dataclasses are refused with ``TypeError``, as the
  standard library does;
- integers beyond 64 bits are refused (``TypeError``), where the standard
  library would write them; nothing on the bus or the audit trail carries one.
  UUIDs, which orjson writes as strings, are left to it.
"""

from __future__ import annotations

import json
from typing import Any

import orjson

_OPTIONS = orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_PASSTHROUGH_DATACLASS


def _default(value: Any) -> Any:
    if isinstance(value, float):  # a float subclass: numpy.float64 and the like
        return float(value)
    raise TypeError(f"{type(value).__name__} is not plain JSON")


def dumps(data: Any, *, sort_keys: bool = False) -> bytes:
    """Compact JSON of plain finite data: ``ValueError`` for NaN or infinity, ``TypeError`` for anything else."""
    options = _OPTIONS | orjson.OPT_SORT_KEYS if sort_keys else _OPTIONS
    encoded = orjson.dumps(data, default=_default, option=options)
    if b"null" in encoded:
        json.dumps(data, allow_nan=False)
    return encoded


def canonical(data: Any) -> str:
    """Sorted keys, no spaces, no NaN: one text for one value."""
    return dumps(data, sort_keys=True).decode()


def ascii_array(items: list[str | int]) -> bytes:
    """``json.dumps(items, separators=(",", ":"), ensure_ascii=True).encode()``, byte for byte, mostly by orjson.

    For the messages that are hashed or signed (audit events, bus jobs), whose bytes are fixed by their
    format: strings and integers only. For ASCII text orjson writes exactly what the standard library
    does with ``ensure_ascii``, except DEL, which only the latter escapes; anything else (non-ASCII, DEL,
    a lone surrogate) takes the standard library's slower way.
    """
    if any(type(item) is not str and type(item) is not int for item in items):
        raise TypeError("ascii_array takes strings and integers only (floats differ between the encoders)")
    try:
        message = orjson.dumps(items)
    except orjson.JSONEncodeError:  # a lone surrogate: the standard library escapes it
        message = b"\x80"
    if not message.isascii() or b"\x7f" in message:
        message = json.dumps(items, separators=(",", ":"), ensure_ascii=True).encode()
    return message
