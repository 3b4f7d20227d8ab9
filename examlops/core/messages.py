"""Messages shared by serving, the bus, recording and the registry.

Plain frozen dataclasses: pydantic stays at the edges (HTTP bodies, settings,
stream payloads). The request leaves room for seed 001's caller contract
(caller identity, task, deadline) and seed 002's typed port.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

DEFAULT_ALIAS = "Production"
KNOWN_ALIASES = ("Production", "Canary", "Staging")

TASK_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]*$"
"""A task name (``pavement.distress.jpcp``): letters, digits, dots, dashes and underscores; matched
case-insensitively, stored lower-cased."""
TASK_NAME_MAX = 128


def canonical_alias(alias: str, known: tuple[str, ...] | list[str] = KNOWN_ALIASES) -> str:
    """Map an alias to its canonical spelling, case-insensitively ("canary" -> "Canary").

    An alias that none of ``known`` matches is returned unchanged.
    """
    lowered = alias.strip().lower()
    for name in known:
        if name.lower() == lowered:
            return name
    return alias.strip()


@dataclass(frozen=True, slots=True)
class ModelRef:
    """One registered model version: what an alias resolved to, or a pinned version."""

    name: str
    version: str
    run_id: str | None
    source: str


@dataclass(frozen=True, slots=True)
class InferenceRequest:
    """One request for one prediction, after the ingress parsed it.

    ``alias`` is None when the caller did not name one (the model's default
    alias applies, and with it the traffic split); ``version`` pins a raw
    version instead of an alias. ``deadline`` is an absolute UNIX time after
    which nobody waits for the answer. ``routed`` says the alias was already
    drawn from the traffic split for a call of several rows (``Pipeline.route``),
    so every row of that call is answered by the same alias: it is taken as is.
    """

    model: str
    embedding: tuple[float, ...]
    node_count: int
    alias: str | None = None
    version: str | None = None
    job_id: str | None = None
    user_id: str | None = None
    deadline: float | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    routed: bool = False


@dataclass(frozen=True, slots=True)
class InferenceResult:
    """The answer to one request: which model version answered, and what it said."""

    model: str
    alias: str
    version: str
    run_id: str | None
    prediction: float
    job_id: str | None = None
