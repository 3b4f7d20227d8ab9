"""The inference port's one failure taxonomy (seed 002): what every adapter maps its wire errors to.

``Kind`` says what went wrong and whether trying again can help; only ``THROTTLED`` (the backend said it
is full: examlops' budget refusal, HTTP 429, a 503 with ``Retry-After``) and ``INFRASTRUCTURE`` (a
connection refused or reset, a 5xx that is not the model's) are retryable. ``code`` is a stable string a
caller may branch on; ``backend`` and ``route`` name where it happened.
"""

from __future__ import annotations

from enum import StrEnum


class Kind(StrEnum):
    VALIDATION = "validation"
    """The input (or a backend's output) does not match the spec's model."""
    PRECONDITION = "precondition"
    """The call cannot be made as asked: a feature the backend lacks, a route nobody wired."""
    THROTTLED = "throttled"
    """The backend is full and said so (retry after a while)."""
    INFRASTRUCTURE = "infrastructure"
    """The backend could not be reached or failed outside the model."""
    TIMEOUT = "timeout"
    """The deadline passed before an answer came."""
    MODEL_FAILURE = "model_failure"
    """The model ran and failed."""


RETRYABLE = frozenset({Kind.THROTTLED, Kind.INFRASTRUCTURE})


class InferenceError(Exception):
    """A failed call through the inference port."""

    def __init__(
        self,
        kind: Kind,
        message: str,
        *,
        code: str | None = None,
        backend: str = "",
        route: str = "",
        retry_after_s: float | None = None,
    ) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.code = code or f"inference_{kind.value}"
        self.backend = backend
        self.route = route
        self.retry_after_s = retry_after_s

    @property
    def retryable(self) -> bool:
        return self.kind in RETRYABLE

    def __str__(self) -> str:
        where = "/".join(part for part in (self.backend, self.route) if part)
        return f"{self.message} ({where})" if where else self.message


class FeatureUnsupported(InferenceError):
    """A call needs what the backend does not offer; raised before any I/O."""

    def __init__(self, feature: str, *, backend: str, route: str = "") -> None:
        super().__init__(
            Kind.PRECONDITION,
            f"the {backend} backend does not support {feature}",
            code="inference_feature_unsupported",
            backend=backend,
            route=route,
        )
        self.feature = feature


ROUTE_UNKNOWN = "inference_route_unknown"


def route_unknown(route: str, *, backend: str = "") -> InferenceError:
    """The error of a call to a route nobody wired (or a backend has no target for)."""
    where = f"the {backend} backend has no target" if backend else "nothing is wired"
    return InferenceError(
        Kind.PRECONDITION, f"{where} for this route", code=ROUTE_UNKNOWN, backend=backend, route=route
    )
