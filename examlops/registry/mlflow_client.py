"""How we reach MLflow: its import, a client on an explicit URI, and its errors translated into ours.

Contracts:

- ``import_mlflow`` imports mlflow with its usage telemetry off unless the environment turns it on.
- ``connect`` builds ``MlflowClient(tracking_uri=..., registry_uri=...)`` on the URI given, never
  the process-global fluent URI. With ``limits`` it first bounds every HTTP request MLflow makes in
  this process (``bound_http``): MLflow reads ``MLFLOW_HTTP_REQUEST_TIMEOUT``,
  ``MLFLOW_HTTP_REQUEST_MAX_RETRIES`` and ``MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR`` from the environment
  on each request, and these are process-wide, so the last limits given win.
- ``translate_error`` maps one MLflow failure onto our family (callers chain it with ``from exc``):
  not found is whatever ``missing()`` builds; a store that cannot be reached (connection errors,
  SQLite ``OperationalError``) is ``RegistryUnavailable``; a name taken is ``Conflict``; refused
  credentials ``ConfigError``; a refused value ``InvalidInput``; anything else ``ExamlopsError``.

Failure mode: MLflow retries before it gives up. Unbounded (MLflow's defaults: 120 s per request, 7
retries with exponential backoff) a stopped server over HTTP holds a call for many minutes; bounded by
``HttpLimits`` (``mlflow.timeout_s``, ``mlflow.max_retries``: what the composition root passes) a call
fails with ``RegistryUnavailable`` within about ``(max_retries + 1) * timeout_s`` plus a second of
backoff per retry. A SQLite store has no such limit (the figure is in bench/RESULTS.md).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from examlops.core.errors import ConfigError, Conflict, ExamlopsError, InvalidInput, RegistryUnavailable

_UNAVAILABLE_CODES = frozenset({"TEMPORARILY_UNAVAILABLE", "SERVICE_UNDER_MAINTENANCE", "REQUEST_LIMIT_EXCEEDED"})
_DENIED_CODES = frozenset({"PERMISSION_DENIED", "UNAUTHENTICATED", "CUSTOMER_UNAUTHORIZED"})


def import_mlflow() -> Any:
    """Import mlflow with its usage telemetry off unless the environment says otherwise.

    MLflow 3 decides at import time whether to send telemetry and then writes
    ``~/.config/mlflow/telemetry.json``: outside the state folder, and a
    network call on offline machines. ``MLFLOW_DISABLE_TELEMETRY=false`` turns it back on.
    """
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    import mlflow

    return mlflow


@dataclass(frozen=True, slots=True)
class HttpLimits:
    """How long one HTTP request to an MLflow server may take, and how often a failed one is retried."""

    timeout_s: int = 5
    max_retries: int = 1
    backoff_factor: int = 1
    """urllib3's: about ``backoff_factor * 2 ** (retry - 1)`` seconds before each retry."""


def bound_http(limits: HttpLimits) -> None:
    """Bound every HTTP request MLflow makes from now on in this process (module docstring)."""
    os.environ["MLFLOW_HTTP_REQUEST_TIMEOUT"] = str(limits.timeout_s)
    os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] = str(limits.max_retries)
    os.environ["MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR"] = str(limits.backoff_factor)


def connect(tracking_uri: str, limits: HttpLimits | None = None) -> Any:
    """An ``MlflowClient`` for ``tracking_uri`` as tracking and registry URI; ``limits`` bound its HTTP requests.

    ``RegistryUnavailable`` when the store cannot be opened, ``ConfigError`` when MLflow refuses the
    URI itself.
    """
    if limits is not None:
        bound_http(limits)
    mlflow = import_mlflow()
    try:
        # Eager for SQL stores: opens the database and runs MLflow's migrations.
        return mlflow.MlflowClient(tracking_uri=tracking_uri, registry_uri=tracking_uri)
    except Exception as exc:
        error = translate_error(exc, lambda: ConfigError("unused"))
        if not isinstance(error, RegistryUnavailable):
            error = ConfigError(f"the MLflow tracking URI {tracking_uri!r} cannot be used: {exc}")
        raise error from exc


def translate_error(exc: BaseException, missing: Callable[[], ExamlopsError]) -> ExamlopsError:
    """Our error for an MLflow failure; ``missing()`` builds the not-found error of what was asked."""
    code = getattr(exc, "error_code", None)
    if code == "RESOURCE_DOES_NOT_EXIST":
        return missing()
    text = str(exc)
    if code in _UNAVAILABLE_CODES or isinstance(exc, ConnectionError) or text.startswith("API request to"):
        # MLflow wraps requests' connection errors as INTERNAL_ERROR with this message and no cause.
        return RegistryUnavailable(f"the MLflow registry cannot be reached: {text[:300]}")
    if type(exc).__name__ == "OperationalError":  # sqlalchemy / sqlite3, without importing either
        return RegistryUnavailable(f"the MLflow store cannot be opened: {text[:300]}")
    if type(exc.__cause__).__name__ in ("OperationalError", "DatabaseError"):
        # MLflow wraps a store it cannot read (e.g. "file is not a database") as BAD_REQUEST.
        return RegistryUnavailable(f"the MLflow store cannot be read: {text[:300]}")
    if code == "RESOURCE_ALREADY_EXISTS":
        return Conflict(f"MLflow refused a change: {text[:300]}")
    if code in _DENIED_CODES:
        return ConfigError(f"MLflow refused the credentials: {text[:300]}")
    if code in ("INVALID_PARAMETER_VALUE", "BAD_REQUEST"):
        return InvalidInput(f"MLflow refused a value: {text[:300]}")
    return ExamlopsError(f"MLflow registry error: {text[:300]}")
