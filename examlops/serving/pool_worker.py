"""The child side of the predict pool: one long-lived process that holds loaded models.

It reads requests ``(request id, op, key, argument)`` from its end of the pipe, one at a
time and in order, and answers each with ``(request id, status, value)``:

- ``ping``: answered once the process has started (the pool's readiness check).
- ``load``: ``loader(location)`` under ``key``; status ``ok`` with the number of input columns the
  model declares (``n_features_in_``, None when it does not say), ``load_error`` with the cause if it raises.
- ``unload``: forgets ``key``; unknown keys are ignored.
- ``predict``: status ``ok`` with a finite float64 1-D array of one value per row, ``failed``
  with a short message when the model raises or returns an empty, wrongly sized or non-finite
  result (the process survives), ``missing`` when the key is not loaded here.

It ignores SIGINT and SIGTERM, which reach every process of serving (Ctrl-C; systemd's default stop):
the parent owns shutdown, draining the calls in flight first. It exits at once on pipe EOF or, even in the
middle of a prediction, within a second of its parent's death.
"""

from __future__ import annotations

import numbers
import os
import signal
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any

import numpy as np

from examlops.core.children import exit_now, exit_with_parent

if TYPE_CHECKING:  # the child imports only what it runs
    from examlops.serving.ports import ModelLoader, Predictor

MESSAGE_CHARS = 200


def serve(conn: Connection, loader: ModelLoader, parent_pid: int) -> None:
    """Run requests until the parent closes the pipe or dies."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    exit_with_parent(parent_pid)
    models: dict[str, Predictor] = {}
    while True:
        try:
            request_id, op, key, argument = conn.recv()
        except EOFError:
            exit_now(0)
        status, value = _handle(models, loader, op, key, argument)
        conn.send((request_id, status, value))


def _handle(models: dict[str, Predictor], loader: ModelLoader, op: str, key: str, argument: Any) -> tuple[str, Any]:
    if op == "ping":
        return "ok", os.getpid()
    if op == "load":
        try:
            models[key] = loader(argument)
        except Exception as exc:  # the loader may raise anything; the parent names the key
            return "load_error", _short(exc)
        return "ok", _declared_columns(models[key])
    if op == "unload":
        models.pop(key, None)
        return "ok", None
    model = models.get(key)
    if model is None:
        return "missing", f"model version {key!r} is not loaded in this worker"
    try:
        return "ok", _checked(model.predict(argument), len(argument))
    except Exception as exc:  # any model error is a failed prediction, never a dead worker
        return "failed", f"model {key!r} failed: {_short(exc)}"


def _declared_columns(model: object) -> int | None:
    """``n_features_in_`` as scikit-learn sets it at fit, or None (``registry.loader.expected_features``,
    repeated here because that module imports mlflow and the serving core may not)."""
    value = getattr(model, "n_features_in_", None)
    return int(value) if isinstance(value, numbers.Integral) and not isinstance(value, bool) else None


def _checked(result: Any, rows: int) -> np.ndarray[Any, np.dtype[np.float64]]:
    """One finite float per row, as a 1-D float64 array; ``(n, 1)`` outputs are flattened."""
    values = np.asarray(result, dtype=np.float64).reshape(-1)
    if values.size == 0:
        raise ValueError("empty prediction")
    if values.size != rows:
        raise ValueError(f"{values.size} values for {rows} rows")
    if not np.isfinite(values).all():
        raise ValueError("non-finite values in the prediction")
    return values


def _short(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}"
    return text if len(text) <= MESSAGE_CHARS else text[: MESSAGE_CHARS - 3] + "..."
