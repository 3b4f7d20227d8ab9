"""The port's boundary shaping: typed instances to plain rows, plain rows to typed outputs, captured rows.

- ``input_rows``: each instance is the spec's input model or a mapping validated into it; anything else,
  or a mapping that does not validate, is ``InferenceError`` VALIDATION (``inference_input_invalid``,
  naming the instance's index) for the whole batch. Rows are ``model_dump(mode="json")``: JSON-able, in
  the input model's field order.
- ``output_models``: exactly one output per row, each a mapping that validates into the spec's output
  model; a wrong count or a mis-shaped row is VALIDATION ``inference_output_invalid`` naming the backend
  and the route, for the whole batch (a backend's wrong answer is never half-used).
- ``redacted``: every top-level input field shown as ``"<redacted>"`` (field names kept, values gone).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel, ValidationError

from examlops.inference.errors import InferenceError, Kind
from examlops.inference.ports import Row
from examlops.inference.spec import InferenceSpec

REDACTED = "<redacted>"


def _fields(error: ValidationError) -> str:
    return ", ".join(".".join(str(part) for part in item["loc"]) or "(root)" for item in error.errors()[:5])


def input_rows(spec: InferenceSpec[Any, Any], instances: Sequence[object]) -> list[dict[str, Any]]:
    """The instances as JSON-able rows; VALIDATION for the whole batch on the first bad one."""
    rows: list[dict[str, Any]] = []
    for index, instance in enumerate(instances):
        if isinstance(instance, spec.input):
            model: BaseModel = instance
        elif isinstance(instance, Mapping):
            try:
                model = spec.input.model_validate(instance)
            except ValidationError as exc:
                # The values are not echoed: inputs are usually PII-dense (seed 002).
                raise InferenceError(
                    Kind.VALIDATION,
                    f"instance {index} does not match {spec.input.__name__}: {_fields(exc)}",
                    code="inference_input_invalid",
                    route=spec.name,
                ) from None
        else:
            raise InferenceError(
                Kind.VALIDATION,
                f"instance {index} is a {type(instance).__name__}, not {spec.input.__name__} or a mapping",
                code="inference_input_invalid",
                route=spec.name,
            )
        rows.append(model.model_dump(mode="json"))
    return rows


def output_models(spec: InferenceSpec[Any, Any], outputs: Sequence[Row], *, expected: int, backend: str) -> list[Any]:
    """One output model per row, in order; VALIDATION ``inference_output_invalid`` otherwise."""

    def invalid(message: str) -> InferenceError:
        return InferenceError(
            Kind.VALIDATION, message, code="inference_output_invalid", backend=backend, route=spec.name
        )

    if isinstance(outputs, (str, bytes, Mapping)) or not isinstance(outputs, Sequence):
        raise invalid(f"the {backend} backend returned a {type(outputs).__name__}, not a list of outputs")
    if len(outputs) != expected:
        raise invalid(f"the {backend} backend returned {len(outputs)} outputs for {expected} instances")
    shaped: list[Any] = []
    for index, row in enumerate(outputs):
        if not isinstance(row, Mapping):
            raise invalid(f"output {index} from the {backend} backend is a {type(row).__name__}, not a mapping")
        try:
            shaped.append(spec.output.model_validate(row))
        except ValidationError as exc:
            raise invalid(
                f"output {index} from the {backend} backend does not match {spec.output.__name__}: {_fields(exc)}"
            ) from exc
    return shaped


def redacted(row: Mapping[str, Any]) -> dict[str, Any]:
    return dict.fromkeys(row, REDACTED)
