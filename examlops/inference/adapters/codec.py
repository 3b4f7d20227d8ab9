"""Rows <-> float vectors for the tensor protocols (Open Inference Protocol, MLflow's tensor signature).

Pure functions, no I/O.

- ``row_vector(row, fields)``: one row mapping as one flat float vector, field by field in ``fields``
  order (None: the row's own key order, which is the spec input's field order since the port dumps the
  instance). A field holds a number (an int becomes a float) or a list of numbers, flattened in order;
  anything else (a string, a bool, None, a nested list, NaN or infinity) is ``VALIDATION`` naming the
  field, never its value. A field the row lacks is ``VALIDATION`` too.
- ``rows_matrix(rows, fields)``: every row's vector, all of one width (else ``VALIDATION``).
- ``output_row(value, fields)``: one row's prediction (a scalar or a vector) as the output model's
  fields: one field takes the scalar (a one-element vector is unwrapped; a longer vector stays a list, a
  tensor-valued field); several fields take the vector's values in order and need exactly as many.
- ``output_rows(values, fields, count)``: one mapping per row; a reply with another number of rows, or a
  row that does not fit, is ``VALIDATION`` (a backend's output that does not match the spec's model).
- ``fields_of(model)``: a pydantic model's field names in order, for a target that takes them from the spec.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel

from examlops.inference.errors import InferenceError, Kind

Row = Mapping[str, Any]


def _bad(message: str, code: str) -> InferenceError:
    return InferenceError(Kind.VALIDATION, message, code=code)


def _number(value: object, field: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _bad(
            f"{field}: must be a number or a list of numbers for a tensor backend", "inference_input_not_numeric"
        )
    number = float(value)
    if not math.isfinite(number):
        raise _bad(f"{field}: must be finite", "inference_input_not_numeric")
    return number


def fields_of(model: type[BaseModel]) -> tuple[str, ...]:
    """The model's field names in declaration order."""
    return tuple(model.model_fields)


def row_vector(row: Row, fields: Sequence[str] | None = None) -> list[float]:
    """``row`` as one flat float vector (module docstring)."""
    vector: list[float] = []
    for name in row if fields is None else fields:
        if name not in row:
            raise _bad(f"{name}: missing from the row", "inference_input_missing")
        value = row[name]
        if isinstance(value, (list, tuple)):
            vector.extend(_number(item, name) for item in value)
        else:
            vector.append(_number(value, name))
    return vector


def rows_matrix(rows: Sequence[Row], fields: Sequence[str] | None = None) -> list[list[float]]:
    """Every row as a vector, all of one width (module docstring)."""
    matrix = [row_vector(row, fields) for row in rows]
    widths = {len(vector) for vector in matrix}
    if len(widths) > 1:
        raise _bad(f"rows flatten to different widths {sorted(widths)}", "inference_input_ragged")
    return matrix


def output_row(value: object, fields: Sequence[str]) -> dict[str, Any]:
    """One row's prediction as the output model's fields (module docstring)."""
    if not fields:
        raise _bad("the output names no field", "inference_output_mismatch")
    values = list(value) if isinstance(value, (list, tuple)) else [value]
    if len(fields) == 1:
        if len(values) == 1:
            return {fields[0]: values[0]}
        return {fields[0]: values}
    if len(values) != len(fields):
        raise _bad(
            f"the backend gave {len(values)} values a row for {len(fields)} output fields", "inference_output_mismatch"
        )
    return dict(zip(fields, values, strict=True))


def output_rows(values: Sequence[object], fields: Sequence[str], count: int) -> list[dict[str, Any]]:
    """One output mapping per row, in order (module docstring)."""
    if len(values) != count:
        raise _bad(f"the backend answered {len(values)} rows for {count}", "inference_output_mismatch")
    return [output_row(value, fields) for value in values]
