"""A Jepsen-style history of client operations: each one invoked, then ok, failed or unknown.

Contract:

- ``History.invoke`` opens an operation; exactly one of ``ok``, ``failed`` or
  ``unknown`` closes it. ``failed`` means it certainly did not happen (refused
  before it was sent); ``unknown`` means it may or may not have happened (a
  timeout, a lost connection). ``submitted`` on an unknown operation says the
  request certainly reached Redis (the bus client's ``DeadlineExceeded`` is
  raised only after its job was put on the stream).
- ``bus_request`` runs one ``BusClient.request`` and classifies it: any reply
  (a prediction, an error body, a refusal) is ``ok`` (the job was answered);
  ``DeadlineExceeded`` is ``unknown`` and submitted; ``StoreUnavailable`` and
  any other error after sending began is ``unknown``; a request refused by the
  client itself (``InvalidInput``, ``ModelNotFound``) is ``failed``.
- ``mark(name)`` stamps a fault or a heal on the same clock, so the checker
  can measure the time to recover. The clock is monotonic and injected.
- ``load_around_faults()`` proves the faults hit work in flight: every
  ``fault:`` mark with operations in flight at it, answers before the first
  fault and after the last heal; a fault that lands in an idle moment, or a
  load that ended before it, fails the scenario instead of passing unseen.

Nothing here reads Redis: ``checker.check`` compares the history with what
Redis holds after the run.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from examlops.bus.client import BusClient, RefusedJob
from examlops.core.errors import DeadlineExceeded, InvalidInput, ModelNotFound


class Outcome(StrEnum):
    OK = "ok"
    FAILED = "failed"
    UNKNOWN = "unknown"


@dataclass(slots=True)
class Operation:
    index: int
    kind: str
    key: str
    invoked: float
    completed: float | None = None
    outcome: Outcome | None = None
    value: dict[str, Any] | None = None
    error: str = ""
    submitted: bool = False

    @property
    def answered_ok(self) -> bool:
        """Ok, and the answer was not an error body."""
        return self.outcome is Outcome.OK and self.value is not None and self.value.get("error") is None


def _answered_ok(op: Operation) -> bool:
    return op.answered_ok


@dataclass
class History:
    clock: Callable[[], float] = time.monotonic
    operations: list[Operation] = field(default_factory=list)
    marks: list[tuple[str, float]] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def invoke(self, kind: str, key: str) -> Operation:
        with self._lock:
            op = Operation(len(self.operations), kind, key, self.clock())
            self.operations.append(op)
            return op

    def _close(self, op: Operation, outcome: Outcome, value: dict[str, Any] | None, error: str) -> Operation:
        if op.outcome is not None:
            raise ValueError(f"operation {op.index} ({op.key}) was closed already as {op.outcome}")
        op.completed, op.outcome, op.value, op.error = self.clock(), outcome, value, error
        return op

    def ok(self, op: Operation, value: Mapping[str, Any]) -> Operation:
        return self._close(op, Outcome.OK, dict(value), "")

    def failed(self, op: Operation, error: str) -> Operation:
        return self._close(op, Outcome.FAILED, None, error)

    def unknown(self, op: Operation, error: str, *, submitted: bool = False) -> Operation:
        op.submitted = submitted
        return self._close(op, Outcome.UNKNOWN, None, error)

    def mark(self, name: str) -> float:
        now = self.clock()
        with self._lock:
            self.marks.append((name, now))
        return now

    def open(self) -> list[Operation]:
        return [op for op in self.operations if op.outcome is None]

    def count_closed(self) -> int:
        return sum(1 for op in self.operations if op.outcome is not None)

    def count(self, outcome: Outcome) -> int:
        return sum(1 for op in self.operations if op.outcome is outcome)

    def in_flight_at(self, t: float) -> int:
        """Operations invoked before ``t`` and not closed by then: the work a fault at ``t`` lands on."""
        return sum(1 for op in self.operations if op.invoked <= t and (op.completed is None or op.completed > t))

    def answered_between(
        self, start: float, end: float = float("inf"), good: Callable[[Operation], bool] | None = None
    ) -> int:
        """Operations ``good`` (by default: answered without an error body) that completed in [``start``, ``end``)."""
        good = good or _answered_ok
        return sum(1 for op in self.operations if good(op) and op.completed and start <= op.completed < end)

    def marked(self, prefix: str) -> list[float]:
        """The times of the marks whose name starts with ``prefix`` ("fault:", "heal:")."""
        return [t for name, t in self.marks if name.startswith(prefix)]

    def load_around_faults(self, good: Callable[[Operation], bool] | None = None) -> list[str]:
        """What shows the faults missed the load, or [] when they hit it: each fault mark with no operation in
        flight at it (it landed in an idle moment), no ``good`` answer (by default: without an error body)
        before the first fault, none after the last heal (or the last fault, without a heal mark). A scenario
        asserts it is empty."""
        faults = self.marked("fault:")
        if not faults:
            return ["no fault was marked"]
        found = [
            f"nothing in flight at {name}"
            for name, t in self.marks
            if name.startswith("fault:") and self.in_flight_at(t) == 0
        ]
        if self.answered_between(0.0, faults[0], good) == 0:
            found.append("no answer before the first fault")
        last = max(self.marked("heal:") or faults)
        if self.answered_between(last, good=good) == 0:
            found.append("no answer after the last heal")
        return found

    async def bus_request(
        self,
        client: BusClient,
        address: str,
        payload: Mapping[str, Any],
        timeout_s: float,
        job_id: str,
        budget_ms: float | None = None,
    ) -> Operation:
        op = self.invoke("bus", job_id)
        try:
            # The client's own timeout ends the wait; the outer one only guards against a hang in the client.
            budget = {} if budget_ms is None else {"budget_ms": budget_ms}
            sent = client.request(address, payload, timeout_s, job_id=job_id, **budget)
            reply = await asyncio.wait_for(sent, timeout_s + 30)
        except RefusedJob as refused:
            return self.ok(op, refused.reply)
        except DeadlineExceeded as exc:
            return self.unknown(op, f"DeadlineExceeded: {exc}", submitted=True)
        except (InvalidInput, ModelNotFound) as exc:
            return self.failed(op, f"{type(exc).__name__}: {exc}")
        except Exception as exc:  # StoreUnavailable, a hang: it may have been sent
            return self.unknown(op, f"{type(exc).__name__}: {exc}")
        return self.ok(op, reply)

    def to_json(self) -> dict[str, Any]:
        return {
            "marks": [{"name": name, "t": t} for name, t in self.marks],
            "operations": [
                {
                    "index": op.index,
                    "kind": op.kind,
                    "key": op.key,
                    "invoked": op.invoked,
                    "completed": op.completed,
                    "outcome": None if op.outcome is None else str(op.outcome),
                    "error": op.error,
                    "submitted": op.submitted,
                    "reply_error": None if op.value is None else op.value.get("code"),
                }
                for op in self.operations
            ],
        }
