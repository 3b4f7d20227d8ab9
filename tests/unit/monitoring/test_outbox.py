"""The retrain outbox: kept until the control plane accepts, retried with backoff, delivered exactly once."""

from __future__ import annotations

import pytest

from examlops.core.backoff import Backoff
from examlops.monitoring.retrain import OutboxDelivery, RetrainRequest
from tests.unit.monitoring.fakes import Clock, FakeRequester, InMemoryOutbox


def request(key: str = "examlops-retrain-jpcp-1", at: float = 0.0) -> RetrainRequest:
    return RetrainRequest("JPCP", "failure rate 30/50", key, at)


def test_a_request_stays_queued_while_the_requester_fails_and_is_delivered_once_it_accepts() -> None:
    clock, outbox, requester = Clock(), InMemoryOutbox(), FakeRequester(fail_first=3)
    outbox.add(request())
    delivery = OutboxDelivery(outbox, requester, backoff=Backoff(1.0, 60.0), clock=clock)
    assert delivery.deliver_due() == 0
    assert outbox.last["jpcp"]["attempts"] == 1 and "cannot be reached" in outbox.last["jpcp"]["error"]
    assert [r.idempotency_key for r in outbox.pending()] == ["examlops-retrain-jpcp-1"]
    # Backoff: 1 s, then 2 s, then 4 s; no attempt before each has passed.
    for wait in (1.0, 2.0, 4.0):
        clock.advance(wait - 0.01)
        assert delivery.deliver_due() == 0
        clock.advance(0.01)
        accepted = delivery.deliver_due()
    assert accepted == 1 and len(requester.calls) == 4
    assert outbox.pending() == []
    assert outbox.last["jpcp"]["flow_run_id"] == "run-1" and outbox.last["jpcp"]["error"] is None
    clock.advance(1000)
    assert delivery.deliver_due() == 0 and len(requester.calls) == 4


def test_the_backoff_is_capped() -> None:
    clock, outbox, requester = Clock(), InMemoryOutbox(), FakeRequester(fail_first=100)
    outbox.add(request())
    delivery = OutboxDelivery(outbox, requester, backoff=Backoff(1.0, 8.0), clock=clock)
    for _ in range(20):
        delivery.deliver_due()
        clock.advance(8.0)
    assert len(requester.calls) == 20


def test_every_delivery_of_a_request_carries_the_same_idempotency_key() -> None:
    clock, outbox, requester = Clock(), InMemoryOutbox(), FakeRequester(fail_first=2)
    outbox.add(request("k-1", at=1.0))
    outbox.add(request("k-2", at=2.0))
    delivery = OutboxDelivery(outbox, requester, clock=clock)
    for _ in range(5):
        delivery.deliver_due()
        clock.advance(10)
    assert requester.calls == ["k-1", "k-2", "k-1", "k-2"]
    assert requester.runs == {"k-1": "run-1", "k-2": "run-2"}


def test_a_failing_store_update_is_an_error_of_the_pass_not_a_lost_request() -> None:
    clock, outbox, requester = Clock(), InMemoryOutbox(), FakeRequester()
    outbox.add(request())

    def broken(*_args: object) -> None:
        raise ConnectionError("redis down")

    outbox.delivered = broken  # type: ignore[method-assign,assignment]  # steer the fake to fail
    delivery = OutboxDelivery(outbox, requester, clock=clock)
    with pytest.raises(ConnectionError):
        delivery.deliver_due()
    assert len(outbox.pending()) == 1  # delivered again later; Prefect's idempotency key makes it one run
