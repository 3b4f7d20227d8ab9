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


def scripted(*times: float) -> History:
    return History(clock=iter(times).__next__)


def test_a_fault_on_work_in_flight_with_answers_before_and_after_is_a_hit() -> None:
    history = scripted(0.0, 1.0, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0)
    before = history.invoke("bus", "a")  # 0
    history.ok(before, {"error": None})  # 1
    held = history.invoke("bus", "b")  # 2
    history.mark("fault:x")  # 2.5: b in flight
    history.ok(held, {"error": None})  # 3
    history.mark("heal:x")  # 4
    after = history.invoke("bus", "c")  # 5
    history.ok(after, {"error": None})  # 6
    assert history.in_flight_at(2.5) == 1
    assert history.load_around_faults() == []


def test_a_fault_in_an_idle_moment_or_without_answers_around_it_is_named() -> None:
    history = scripted(0.0, 1.0, 2.0, 3.0, 4.0, 5.0)
    early = history.invoke("bus", "a")  # 0
    history.ok(early, {"error": None})  # 1
    history.mark("fault:idle")  # 2: nothing in flight
    late = history.invoke("bus", "b")  # 3
    history.ok(late, {"error": "pipeline_unavailable", "code": "pipeline_unavailable"})  # 4: an error body
    history.mark("heal:idle")  # 5
    assert history.load_around_faults() == ["nothing in flight at fault:idle", "no answer after the last heal"]
    assert scripted().load_around_faults() == ["no fault was marked"]
    quiet = scripted(0.0, 1.0, 2.0)
    op = quiet.invoke("bus", "a")  # 0
    quiet.mark("fault:first")  # 1
    quiet.ok(op, {"error": None})  # 2
    assert quiet.load_around_faults() == ["no answer before the first fault"]
