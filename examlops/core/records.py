"""The record of one served bus job, and the port that takes records.

``ServedInference`` is the one shape of a served job from the bridge to the
recorder; ``InferenceRecorder`` is what the bridge hands it to.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol


@dataclass(frozen=True, slots=True)
class ServedInference:
    """A job that serving answered and whose reply was written for the first time."""

    job_id: str
    address: str
    model: str
    caller: str
    embedding: tuple[float, ...]
    node_count: int
    reply: Mapping[str, Any]
    status: int
    served_at: float


class InferenceRecorder(Protocol):
    """Called on the bridge's event loop once per job (never for duplicates or refused jobs): must not block."""

    def record(self, served: Sequence[ServedInference]) -> None: ...


class NoRecorder:
    def record(self, served: Sequence[ServedInference]) -> None:
        return None
