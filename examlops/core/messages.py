"""Messages shared by serving, the bus, recording and the registry.

Plain frozen dataclasses: pydantic stays at the edges (HTTP bodies, settings,
stream payloads). The request leaves room for seed 001's caller contract
(caller identity, task, deadline) and seed 002's typed port.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from examlops.core.errors import InvalidInput

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


def served_aliases(aliases: Sequence[str], default_alias: str | None = None) -> tuple[str, ...]:
    """The aliases serving loads for a model: ``aliases`` (``settings.hotset.aliases``) in their canonical spelling,
    then the model's ``default_alias`` when it is not among them (serving loads it too)."""
    served = [canonical_alias(alias) for alias in aliases]
    if default_alias is not None and default_alias.lower() not in {name.lower() for name in served}:
        served.append(canonical_alias(default_alias))
    return tuple(served)


def served_alias(alias: str, served: Sequence[str], model: str, *, field: str = "alias") -> str:
    """``alias`` in its canonical spelling when it is one of ``served`` (``served_aliases``), in any case;
    ``InvalidInput`` naming them otherwise: serving would never load any other alias, so nothing may point
    at one (a task, a promotion)."""
    chosen = canonical_alias(alias, list(served))
    if chosen.lower() not in {name.lower() for name in served}:
        raise InvalidInput(
            f"serving loads the aliases {', '.join(served)} of {model}: {chosen!r} is none of them", field=field
        )
    return chosen


@dataclass(frozen=True, slots=True)
class ModelRef:
    """One registered model version: what an alias resolved to, or a pinned version."""

    name: str
    version: str
    run_id: str | None
    source: str


@dataclass(slots=True)
class ServingFacts:
    """Where one request went inside serving, filled in by the pipeline as it goes; read for its trace.

    Owned by one request (its ``InferenceRequest.facts``), written only on the event loop. A field stays
    None when the request never got that far: ``queue_wait_ms`` once its micro-batch is handled;
    ``batch_id``, ``batch_size``, ``version`` and ``predict_ms`` once a predict call of one loaded version
    took it (the batch is that call: every request predicted together, whatever they were queued with).
    """

    queued_at: float = 0.0
    """Monotonic seconds when the request was handed to the micro-batcher."""
    queue_wait_ms: float | None = None
    batch_id: str | None = None
    batch_size: int | None = None
    predict_ms: float | None = None
    alias: str | None = None
    version: str | None = None


@dataclass(frozen=True, slots=True)
class InferenceRequest:
    """One request for one prediction, after the ingress parsed it.

    ``alias`` is None when the caller did not name one (the model's default
    alias applies, and with it the traffic split); ``version`` pins a raw
    version instead of an alias. ``deadline`` is an absolute UNIX time after
    which nobody waits for the answer: the earlier of the caller's deadline and
    the end of its budget (``examlops.core.budget``); ``budget_ms`` is the
    budget the call declared (or its task's default), kept for the answer and
    the trace. ``task`` and ``identity`` label refusals in the metrics. ``routed`` says the alias was already
    drawn from the traffic split for a call of several rows (``Pipeline.route``),
    so every row of that call is answered by the same alias: it is taken as is.
    ``admitted`` says the call this row belongs to was admitted as a whole before the row was sent (a stream,
    once at its start: ``Pipeline.admit``), so serving does not estimate the row again; it still ends at
    its deadline (refused late, never run).
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
    facts: ServingFacts | None = field(default=None, compare=False, repr=False)
    """Filled in by the pipeline when given (the trace reads it); None: nothing is noted."""
    routed: bool = False
    budget_ms: float | None = None
    task: str | None = None
    identity: str | None = None
    admitted: bool = False


@dataclass(frozen=True, slots=True)
class InferenceResult:
    """The answer to one request: which model version answered, and what it said."""

    model: str
    alias: str
    version: str
    run_id: str | None
    prediction: float
    job_id: str | None = None
