"""``InferenceSpec``: one logical task with typed input and output; never a model, artifact or protocol."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, TypeVar

from pydantic import BaseModel

I = TypeVar("I", bound=BaseModel)  # noqa: E741 - the seed's name for the input type
O = TypeVar("O", bound=BaseModel)  # noqa: E741 - the seed's name for the output type


@dataclass(frozen=True, slots=True)
class InferenceSpec(Generic[I, O]):
    """A task the application calls: ``name`` is what the wiring binds to a backend.

    A scalar prediction is a one-field ``output`` model; tensors are lists of floats inside the models.
    ``capture_inputs``: traces captured by the port keep the input's values (else ``"<redacted>"``).
    """

    name: str
    input: type[I]
    output: type[O]
    capture_inputs: bool = False
