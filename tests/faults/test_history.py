"""How the history classifies a bus request's end: answered, certainly not done, or unknown."""

from __future__ import annotations

from typing import Any

import pytest

from examlops.bus.client import RefusedJob
from examlops.core.errors import DeadlineExceeded, InvalidInput, StoreUnavailable
from tests.faults.history import History, Outcome


class ScriptedClient:
    """Stands in for ``BusClient.request``: answers ``reply`` or raises ``error``."""

    def __init__(self, reply: dict[str, Any] | None = None, error: Exception | None = None) -> None:
        self.reply, self.error = reply, error

    async def request(self, address: str, payload: Any, timeout: float, *, job_id: str) -> dict[str, Any]:  # noqa: ASYNC109  # the client's signature
        if self.error is not None:
            raise self.error
        assert self.reply is not None
        return self.reply


@pytest.mark.parametrize(
    ("client", "outcome", "submitted"),
    [
        (ScriptedClient({"error": None, "prediction": 0.5}), Outcome.OK, False),
        (ScriptedClient({"error": "serving down", "code": "pipeline_unavailable"}), Outcome.OK, False),
        (ScriptedClient(error=RefusedJob({"code": "refused", "refused": "budget"})), Outcome.OK, False),
        (ScriptedClient(error=DeadlineExceeded("no reply")), Outcome.UNKNOWN, True),
        (ScriptedClient(error=StoreUnavailable("Redis down")), Outcome.UNKNOWN, False),
        (ScriptedClient(error=InvalidInput("bad timeout")), Outcome.FAILED, False),
    ],
    ids=["answer", "error-reply", "refused", "timeout", "redis-down", "refused-by-client"],
)
async def test_a_bus_request_is_classified_by_how_it_ended(
    client: ScriptedClient, outcome: Outcome, submitted: bool
) -> None:
    history = History()
    op = await history.bus_request(client, "address", {}, 1.0, "job-1")  # type: ignore[arg-type]  # a stand-in
    assert (op.outcome, op.submitted) == (outcome, submitted)
    assert op.completed is not None and history.open() == []


def test_an_operation_is_closed_once() -> None:
    history = History()
    op = history.invoke("bus", "j")
    history.ok(op, {})
    with pytest.raises(ValueError, match="closed already"):
        history.unknown(op, "late")


def test_a_refused_job_is_not_an_answer_without_error() -> None:
    history = History()
    op = history.ok(history.invoke("bus", "j"), {"error": "refused", "code": "refused"})
    assert not op.answered_ok
