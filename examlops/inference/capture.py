"""What the port hands the caller's capture hook: one ``Capture`` per backend call, inputs redacted.

Every input field is ``"<redacted>"`` unless the spec sets ``capture_inputs=True`` (features are usually
PII-dense and a captured trace is stored and shared). The hook is the caller's: the port writes nothing
itself. A hook that raises is logged and ignored; capture never fails a prediction.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from examlops.inference.errors import InferenceError
from examlops.inference.ports import Call
from examlops.inference.shaping import redacted
from examlops.inference.spec import InferenceSpec

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Capture:
    """One backend call as the port saw it."""

    route: str
    backend: str
    trace_id: str | None
    inputs: tuple[Mapping[str, Any], ...]
    outputs: tuple[Mapping[str, Any], ...] | None
    """None when the call failed."""
    duration_s: float
    error: InferenceError | None


CaptureHook = Callable[[Capture], None]


def emit(
    hook: CaptureHook | None,
    spec: InferenceSpec[Any, Any],
    backend: str,
    call: Call,
    rows: Sequence[Mapping[str, Any]],
    outputs: Sequence[Mapping[str, Any]] | None,
    started: float,
    error: InferenceError | None,
) -> None:
    """Hand ``hook`` the call's capture (inputs redacted unless the spec opts in); never raises."""
    if hook is None:
        return
    inputs = tuple(dict(row) if spec.capture_inputs else redacted(row) for row in rows)
    captured = None if outputs is None else tuple(dict(row) for row in outputs)
    try:
        hook(Capture(call.route, backend, call.trace_id, inputs, captured, time.monotonic() - started, error))
    except Exception:
        log.exception("the inference capture hook failed for %s; the call is not affected", call.route)
