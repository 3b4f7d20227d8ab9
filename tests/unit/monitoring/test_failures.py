"""The retrain trigger: seed 000's classification table, the window, the threshold and the cooldown."""

from __future__ import annotations

from typing import Any

import pytest

from examlops.core.errors import (
    DeadlineExceeded,
    ExamlopsError,
    InferenceFailed,
    InferenceTimeout,
    InvalidInput,
    ModelNotFound,
    PayloadTooLarge,
    PipelineUnavailable,
)
from examlops.core.settings import FailureSettings
from examlops.monitoring.failures import FailureTracker, Outcome, WindowState, classify, failure_status
from tests.unit.monitoring.fakes import Clock, InMemoryFailureStore


def error_reply(error: ExamlopsError) -> dict[str, Any]:
    """The shape of ``bus.replies.error_body``."""
    return {
        "error": error.message,
        "prediction": 0.0,
        "code": error.code,
        "field": error.field,
        "inference_failed": error.model_failure,
        "model": "JPCP",
        "job_id": "j",
    }


def marked(code: str, inference_failed: bool) -> dict[str, Any]:
    """An error reply of serving, passed on by the bridge with its code and marker."""
    return {"error": "serving failed", "prediction": 0.0, "code": code, "inference_failed": inference_failed}


SERVED = {"model": "JPCP", "alias": "Production", "version": "1", "run_id": "r", "prediction": 0.4, "error": None}


@pytest.mark.parametrize(
    ("status", "reply", "expected"),
    [
        (200, SERVED, Outcome.OK),
        (200, {**SERVED, "prediction": 0}, Outcome.OK),
        # 422: a schema error, counted in the window but not a failure
        (422, {"error": "embedding: bad", "prediction": 0.0, "code": "invalid_input"}, Outcome.OK),
        (0, error_reply(InvalidInput("embedding: must be 384 numbers")), Outcome.OK),
        (413, error_reply(PayloadTooLarge("too big")), Outcome.OK),
        (422, {"error": "bad", "prediction": 0.0}, Outcome.OK),
        # 5xx marked inference_failed, or an empty prediction: a model failure
        (500, marked("inference_failed", True), Outcome.FAILURE),
        (500, marked("http_500", True), Outcome.FAILURE),
        (504, error_reply(InferenceTimeout("past 30 s")), Outcome.FAILURE),
        (200, error_reply(InferenceFailed("serving returned an empty prediction")), Outcome.FAILURE),
        (200, {**SERVED, "prediction": None}, Outcome.FAILURE),
        (200, {k: v for k, v in SERVED.items() if k != "prediction"}, Outcome.FAILURE),
        (200, {**SERVED, "prediction": True}, Outcome.FAILURE),
        # anything else: not counted at all
        (404, error_reply(ModelNotFound("no model JPCP")), Outcome.IGNORED),
        (0, error_reply(PipelineUnavailable("serving cannot be reached")), Outcome.IGNORED),
        (503, marked("not_ready", False), Outcome.IGNORED),
        (500, marked("http_500", False), Outcome.IGNORED),
        (0, error_reply(DeadlineExceeded("too late")), Outcome.IGNORED),
    ],
)
def test_replies_are_classified_as_seed_000s_table_says(status: int, reply: dict[str, Any], expected: Outcome) -> None:
    assert classify(status, reply) is expected


def tracker(store: InMemoryFailureStore, clock: Clock, **settings: Any) -> FailureTracker:
    tokens = iter(range(1, 1000))
    return FailureTracker(
        store, FailureSettings(**{"window": 10, **settings}), clock=clock, new_token=lambda: str(next(tokens))
    )


def test_no_retrain_before_the_window_is_full_even_when_every_request_failed() -> None:
    clock = Clock()
    store = InMemoryFailureStore(clock)
    trigger = tracker(store, clock)
    assert [trigger.observe("JPCP", Outcome.FAILURE) for _ in range(9)] == [None] * 9
    request = trigger.observe("JPCP", Outcome.FAILURE)
    assert request is not None and request.model == "JPCP"
    assert request.idempotency_key == "examlops-retrain-jpcp-1"
    assert "10/10" in request.reason
    assert list(store.outbox.queued) == [request.idempotency_key]


def test_a_rate_at_the_threshold_asks_and_one_below_does_not() -> None:
    clock = Clock()
    store = InMemoryFailureStore(clock)
    trigger = tracker(store, clock)
    for _ in range(6):
        trigger.observe("CRCP", Outcome.OK)
    for _ in range(4):
        assert trigger.observe("CRCP", Outcome.FAILURE) is None  # 4/10 < 0.5
    assert trigger.observe("CRCP", Outcome.FAILURE) is not None  # the oldest OK slid out: 5/10


def test_ignored_outcomes_take_no_place_in_the_window() -> None:
    clock = Clock()
    store = InMemoryFailureStore(clock)
    trigger = tracker(store, clock)
    for _ in range(5):
        trigger.observe("AC", Outcome.FAILURE)
    for _ in range(100):
        assert trigger.observe("AC", Outcome.IGNORED) is None
    assert store.window("AC", 10).size == 5
    for _ in range(5):
        request = trigger.observe("AC", Outcome.OK)
    assert request is not None  # 5 failures of 10 counted outcomes


def test_the_cooldown_holds_then_a_still_failing_model_is_asked_for_again() -> None:
    clock = Clock()
    store = InMemoryFailureStore(clock)
    trigger = tracker(store, clock, cooldown_s=300)
    first = [trigger.observe("JPCP", Outcome.FAILURE) for _ in range(10)][-1]
    assert first is not None
    clock.advance(299)
    assert [trigger.observe("JPCP", Outcome.FAILURE) for _ in range(20)] == [None] * 20
    assert store.cooldown_left("JPCP") == pytest.approx(1)
    clock.advance(1)
    second = trigger.observe("JPCP", Outcome.FAILURE)
    assert second is not None and second.idempotency_key != first.idempotency_key
    assert len(store.outbox.queued) == 2


def test_models_have_separate_windows_and_cooldowns() -> None:
    clock = Clock()
    store = InMemoryFailureStore(clock)
    trigger = tracker(store, clock)
    asked = [trigger.observe(model, Outcome.FAILURE) for _ in range(10) for model in ("JPCP", "CRCP")]
    assert sorted(r.model for r in asked if r is not None) == ["CRCP", "JPCP"]


def test_status_reports_rate_fill_cooldown_and_last_request_per_model() -> None:
    clock = Clock()
    store = InMemoryFailureStore(clock)
    trigger = tracker(store, clock, cooldown_s=300)
    for outcome in [Outcome.FAILURE] * 10:
        trigger.observe("JPCP", outcome)
    trigger.observe("CRCP", Outcome.OK)
    clock.advance(100)
    rows = {row.model.lower(): row for row in failure_status(store, ["JPCP", "CRCP", "AC"], 10)}
    assert rows["jpcp"].window.rate == 1.0 and rows["jpcp"].window.full
    assert rows["jpcp"].cooldown_left_s == pytest.approx(200)
    assert rows["jpcp"].last_request is not None and rows["jpcp"].last_request["delivered_at"] is None
    assert rows["crcp"].to_json()["window_size"] == 1 and rows["crcp"].last_request is None
    assert rows["ac"].window.size == 0 and rows["ac"].window.rate == 0.0


def test_a_batch_push_gives_a_state_per_outcome_in_order_and_none_for_ignored_ones() -> None:
    clock = Clock()
    store = InMemoryFailureStore(clock)
    trigger = tracker(store, clock, window=2)
    outcomes = [("JPCP", Outcome.FAILURE), ("AC", Outcome.IGNORED), ("JPCP", Outcome.OK), ("AC", Outcome.FAILURE)]
    states = trigger.push_many(outcomes)
    assert states == [WindowState(1, 1, 2), None, WindowState(2, 1, 2), WindowState(1, 1, 2)]
    assert trigger.push_many([("JPCP", Outcome.IGNORED)]) == [None]
    assert store.windows == {"jpcp": [True, False], "ac": [True]}
