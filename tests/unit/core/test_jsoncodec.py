"""The hot-path JSON encoder keeps the standard library's refusals and acceptances where they matter."""

from __future__ import annotations

import dataclasses
import datetime
import json
import math

import numpy as np
import pytest

from examlops.core.jsoncodec import ascii_array, canonical, dumps


def test_the_text_is_compact_and_canonical_with_sorted_keys() -> None:
    assert canonical({"b": [1.5, None], "a": "é"}) == '{"a":"é","b":[1.5,null]}'
    assert dumps({"b": 1, "a": 2}) == b'{"b":1,"a":2}'


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf, np.float64("nan")])
def test_nan_and_infinity_are_refused_not_written_as_null(bad: float) -> None:
    with pytest.raises(ValueError):
        dumps({"embedding": [0.5, bad]})


def test_numpy_floats_are_written_as_floats_like_the_standard_library_does() -> None:
    assert dumps({"embedding": list(np.array([0.25, -1.0]))}) == b'{"embedding":[0.25,-1.0]}'


@pytest.mark.parametrize(
    "value",
    [datetime.datetime(2026, 1, 1), dataclasses.make_dataclass("D", ["x"])(1), 2**70, object()],
    ids=["datetime", "dataclass", "big-int", "object"],
)
def test_what_is_not_plain_json_is_a_type_error(value: object) -> None:
    with pytest.raises(TypeError):
        dumps({"x": value})


@pytest.mark.parametrize(
    "text",
    [
        "".join(map(chr, range(128))),  # every ASCII character, the control ones and DEL included
        'quote " backslash \\ slash /',
        "é, ✓ and 🚀",
        "lone \ud800 surrogate",
        '{"embedding":[0.1,-2.5e-07,3.0],"node_count":4}',
    ],
)
def test_ascii_array_is_the_standard_librarys_ascii_json_byte_for_byte(text: str) -> None:
    items: list[str | int] = ["v1", 7, text, "", -3, text[::-1]]
    assert ascii_array(items) == json.dumps(items, separators=(",", ":"), ensure_ascii=True).encode()


def test_ascii_array_refuses_floats_whose_text_differs_between_the_encoders() -> None:
    with pytest.raises(TypeError):
        ascii_array(["v1", 1e-7])  # type: ignore[list-item]  # orjson writes 1e-7, the standard library 1e-07
