"""The row codec: rows to float vectors by field order, predictions back to the output model's fields."""

from __future__ import annotations

import math

import pytest
from pydantic import BaseModel

from examlops.inference.adapters.codec import fields_of, output_row, output_rows, row_vector, rows_matrix
from examlops.inference.errors import InferenceError, Kind


class Features(BaseModel):
    embedding: list[float]
    node_count: int


def test_a_row_flattens_in_the_rows_field_order_with_ints_as_floats() -> None:
    row = Features(embedding=[0.5, -1.0], node_count=12).model_dump()
    assert row_vector(row) == [0.5, -1.0, 12.0]
    assert all(isinstance(v, float) for v in row_vector(row))


def test_named_fields_set_the_order_and_leave_other_fields_out() -> None:
    row = {"a": 1, "b": [2.0, 3.0], "c": 9}
    assert row_vector(row, ["b", "a"]) == [2.0, 3.0, 1.0]


def test_fields_of_gives_the_models_declaration_order() -> None:
    assert fields_of(Features) == ("embedding", "node_count")


@pytest.mark.parametrize("bad", ["x", None, True, [1.0, "2"], [[1.0]], math.nan, math.inf])
def test_a_value_that_is_not_a_number_is_a_validation_error_naming_the_field_not_the_value(bad: object) -> None:
    with pytest.raises(InferenceError) as caught:
        row_vector({"f": bad})
    assert caught.value.kind is Kind.VALIDATION
    assert caught.value.message.startswith("f:")
    assert repr(bad) not in caught.value.message or bad is None


def test_a_missing_field_is_a_validation_error() -> None:
    with pytest.raises(InferenceError) as caught:
        row_vector({"a": 1.0}, ["a", "b"])
    assert (caught.value.kind, caught.value.code) == (Kind.VALIDATION, "inference_input_missing")


def test_rows_of_different_widths_are_refused() -> None:
    assert rows_matrix([{"e": [1, 2]}, {"e": [3, 4]}]) == [[1.0, 2.0], [3.0, 4.0]]
    with pytest.raises(InferenceError) as caught:
        rows_matrix([{"e": [1, 2]}, {"e": [3]}])
    assert caught.value.code == "inference_input_ragged"


def test_one_output_field_takes_the_scalar_or_a_one_element_vector_unwrapped() -> None:
    assert output_row(0.25, ["risk"]) == {"risk": 0.25}
    assert output_row([0.25], ["risk"]) == {"risk": 0.25}


def test_one_output_field_keeps_a_longer_vector_as_a_tensor() -> None:
    assert output_row([0.1, 0.2, 0.3], ["scores"]) == {"scores": [0.1, 0.2, 0.3]}


def test_several_output_fields_take_the_vector_in_order_and_need_as_many_values() -> None:
    assert output_row([0.1, 0.9], ["low", "high"]) == {"low": 0.1, "high": 0.9}
    with pytest.raises(InferenceError) as caught:
        output_row([0.1, 0.9, 0.0], ["low", "high"])
    assert (caught.value.kind, caught.value.code) == (Kind.VALIDATION, "inference_output_mismatch")


def test_a_reply_with_another_number_of_rows_is_refused_whole() -> None:
    assert output_rows([1.0, 2.0], ["p"], 2) == [{"p": 1.0}, {"p": 2.0}]
    with pytest.raises(InferenceError) as caught:
        output_rows([1.0], ["p"], 2)
    assert caught.value.code == "inference_output_mismatch"
