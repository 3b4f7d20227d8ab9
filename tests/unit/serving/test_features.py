"""The feature checks of the transformer: the row layout, and a bad request failing alone."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pytest

from examlops.core.errors import InvalidInput
from examlops.core.messages import InferenceRequest
from examlops.registry.catalog import ModelSpec
from examlops.serving.features import Features, validate_features
from tests.unit.serving.fakes import make_spec


def request(embedding: Sequence[float], node_count: int = 3, **kw: str) -> InferenceRequest:
    return InferenceRequest(model="m", embedding=tuple(embedding), node_count=node_count, **kw)  # type: ignore[arg-type]


def test_validated_row_is_embedding_then_node_count_with_metadata() -> None:
    spec = make_spec("m", dim=4)
    (out,) = validate_features([request([0.1, 0.2, 0.3, 0.4], 7, job_id="j1", user_id="u1")], [spec])
    assert isinstance(out, Features)
    assert out.row.dtype == np.float64 and out.row.tolist() == [0.1, 0.2, 0.3, 0.4, 7.0]
    assert (out.job_id, out.user_id) == ("j1", "u1")


def test_catalog_embedding_has_385_columns() -> None:
    spec = make_spec("m", dim=384)
    (out,) = validate_features([request([0.5] * 384)], [spec])
    assert isinstance(out, Features) and out.row.shape == (385,)


@pytest.mark.parametrize(
    ("embedding", "node_count", "field", "message"),
    [
        ([0.1] * 12, 3, "embedding", "expected 4 values, got 12"),
        ([0.1, math.nan, math.inf, 0.2], 3, "embedding", "2 of 4 values are not finite"),
        ([0.1, "x", 0.3, 0.4], 3, "embedding", "must be numbers"),
        ([0.1] * 4, 0, "node_count", "at least 1"),
    ],
)
def test_a_bad_request_fails_alone_without_echoing_its_values(
    embedding: list[float], node_count: int, field: str, message: str
) -> None:
    spec = make_spec("m", dim=4)
    good = request([9.5, 9.25, 9.125, 9.0625])
    outcomes = validate_features([good, request(embedding, node_count), good], [spec] * 3)
    assert isinstance(outcomes[0], Features) and isinstance(outcomes[2], Features)
    error = outcomes[1]
    assert isinstance(error, InvalidInput) and error.field == field and message in str(error)
    assert "0.1" not in str(error)


def bounded_spec(low: float | None, high: float | None, node_max: int | None = None) -> ModelSpec:
    embedding: dict[str, object] = {"type": "float_array", "length": 4}
    if low is not None:
        embedding["minimum"] = low
    if high is not None:
        embedding["maximum"] = high
    node_count: dict[str, object] = {"type": "integer", "minimum": 1}
    if node_max is not None:
        node_count["maximum"] = node_max
    return ModelSpec.model_validate(
        {
            "name": "b",
            "seanerbus_uuid": "00000000-0000-4000-8000-00000000000b",
            "input_schema": {"embedding": embedding, "node_count": node_count},
        }
    )


@pytest.mark.parametrize(
    ("embedding", "node_count", "field", "message"),
    [
        ([0.1, 10.5, 0.1, 0.1], 3, "embedding", "1 of 4 values are outside [-10.0, 10.0]"),
        ([-11.0, -10.5, 0.1, 0.1], 3, "embedding", "2 of 4 values are outside"),
        ([0.1] * 4, 1_000_001, "node_count", "at most 1000000"),
        ([0.1] * 4, 2**70, "node_count", "at most 1000000"),
    ],
)
def test_values_outside_the_catalog_bounds_are_refused_naming_the_field(
    embedding: list[float], node_count: int, field: str, message: str
) -> None:
    spec = bounded_spec(-10.0, 10.0, 1_000_000)
    good = request([10.0, -10.0, 0.0, 0.0], 1_000_000)
    outcomes = validate_features([good, request(embedding, node_count)], [spec, spec])
    assert isinstance(outcomes[0], Features)
    error = outcomes[1]
    assert isinstance(error, InvalidInput) and error.field == field and message in str(error)


def test_bounds_apply_per_spec_within_one_batch() -> None:
    bounded, free = bounded_spec(-1.0, 1.0), bounded_spec(None, None)
    big = request([5.0, 0.0, 0.0, 0.0])
    outcomes = validate_features([big, big], [bounded, free])
    assert isinstance(outcomes[0], InvalidInput) and isinstance(outcomes[1], Features)
