"""The retrain trigger against a real redis-server: shared windows, one retrain per cooldown, a durable outbox."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import redis
import typer
from typer.testing import CliRunner

from examlops.adapters.redis import connect
from examlops.bus.replies import error_body
from examlops.cli.bridge_status import status
from examlops.core.errors import ExamlopsError, InferenceFailed, InvalidInput, PipelineUnavailable
from examlops.core.records import ServedInference
from examlops.core.settings import FailureSettings
from examlops.monitoring.audit import RETRAIN_REQUESTED, STREAM, AuditTrail, verify
from examlops.monitoring.failure_store import RedisFailureStore
from examlops.monitoring.failures import FailureTracker, Outcome, WindowState
from examlops.monitoring.retrain import OutboxDelivery, PrefectRetrainRequester, RedisOutbox, RetrainRequest
from tests.integration.test_recording import add_records, drain, recorder_on
from tests.ports import free_port
from tests.unit.monitoring.fakes import Clock, FakeRequester

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

SECRET = b"trigger-secret"


def test_four_trackers_seeing_the_same_failures_ask_for_one_retrain(redis_server: str, client: redis.Redis) -> None:
    clients = [connect(redis_server) for _ in range(4)]
    trackers = [FailureTracker(RedisFailureStore(c), FailureSettings()) for c in clients]
    start = threading.Barrier(4)
    asked: list[RetrainRequest] = []

    def watch(tracker: FailureTracker) -> None:
        start.wait()
        for _ in range(50):
            request = tracker.observe("JPCP", Outcome.FAILURE)
            if request is not None:
                asked.append(request)

    threads = [threading.Thread(target=watch, args=(t,)) for t in trackers]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        for c in clients:
            c.close()
    assert len(asked) == 1
    assert [r.idempotency_key for r in RedisOutbox(client).pending()] == [asked[0].idempotency_key]
    assert 299 < RedisFailureStore(client).cooldown_left("jpcp") <= 300


def test_the_cooldown_holds_and_a_model_still_failing_after_it_is_asked_for_again(client: redis.Redis) -> None:
    tracker = FailureTracker(RedisFailureStore(client), FailureSettings(window=10, cooldown_s=1.0))
    asked = [tracker.observe("CRCP", Outcome.FAILURE) for _ in range(30)]
    first = [r for r in asked if r is not None]
    assert len(first) == 1 and asked[9] is first[0], "asked as the window filled, then the cooldown held"
    time.sleep(1.1)
    second = tracker.observe("CRCP", Outcome.FAILURE)
    assert second is not None and second.idempotency_key != first[0].idempotency_key
    assert tracker.observe("CRCP", Outcome.FAILURE) is None
    assert len(RedisOutbox(client).pending()) == 2


def test_a_request_made_while_prefect_is_unreachable_is_delivered_exactly_once(client: redis.Redis) -> None:
    tracker = FailureTracker(RedisFailureStore(client), FailureSettings(window=4))
    request = [tracker.observe("AC", Outcome.FAILURE) for _ in range(4)][-1]
    assert request is not None
    clock, requester = Clock(), FakeRequester(fail_first=3)
    trail = AuditTrail(client, SECRET)
    # Two bridges deliver the same outbox: the idempotency key keeps it one run and one audit event.
    deliveries = [OutboxDelivery(RedisOutbox(client), requester, trail, clock=clock) for _ in range(2)]
    for _ in range(6):
        for delivery in deliveries:
            delivery.deliver_due()
        clock.advance(10)
    assert RedisOutbox(client).pending() == []
    assert requester.runs == {request.idempotency_key: "run-1"}
    last = RedisOutbox(client).last()["ac"]
    assert last["flow_run_id"] == "run-1" and last["delivered_at"] is not None and last["error"] is None
    found: Any = client.xrange(STREAM)
    events = [fields for _, fields in found if fields["type"] == RETRAIN_REQUESTED]
    assert len(events) == 1 and json.loads(events[0]["data"])["idempotency_key"] == request.idempotency_key
    assert verify(client, SECRET, None).ok


def test_the_outbox_survives_its_deliverer_and_a_new_one_sends_it(client: redis.Redis) -> None:
    tracker = FailureTracker(RedisFailureStore(client), FailureSettings(window=2))
    tracker.observe("JPCP", Outcome.FAILURE)
    request = tracker.observe("JPCP", Outcome.FAILURE)
    assert request is not None
    OutboxDelivery(RedisOutbox(client), FakeRequester(fail_first=1)).deliver_due()  # then that bridge dies
    requester = FakeRequester()
    delivery = OutboxDelivery(RedisOutbox(client), requester, poll_s=0.05)
    delivery.start()
    try:
        deadline = time.monotonic() + 10
        while RedisOutbox(client).pending() and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        delivery.close()
    assert requester.calls == [request.idempotency_key]


def reply_of(error: ExamlopsError | None) -> tuple[int, dict[str, Any]]:
    """(status, reply) as the bridge produces them: a served answer, a 500 model failure, or an error body."""
    if error is None:
        return 200, {
            "model": "JPCP",
            "alias": "Production",
            "version": "1",
            "run_id": "r",
            "prediction": 0.5,
            "error": None,
        }
    return (500 if error.model_failure else 0), error_body(error, model="JPCP")


def test_recorded_replies_feed_the_shared_window_as_seed_000_classifies_them(
    redis_server: str, client: redis.Redis
) -> None:
    tracker_client = connect(redis_server)
    tracker = FailureTracker(RedisFailureStore(tracker_client), FailureSettings(window=50))
    kinds: list[ExamlopsError | None] = (
        [InferenceFailed("model raised")] * 25 + [InvalidInput("bad embedding")] * 20 + [None] * 5
    )
    kinds += [PipelineUnavailable("serving down")] * 30  # ignored: the window stays at 25/50
    records = []
    for i, kind in enumerate(kinds):
        status_code, reply = reply_of(kind)
        records.append(ServedInference(f"t-{i}", "addr", "JPCP", "u", 3, reply, status_code, time.time()))
    try:
        add_records(client, records)
        drain(recorder_on(tracker_client, "me", tracker=tracker, batch=16, linger_s=0))
    finally:
        tracker_client.close()
    window = RedisFailureStore(client).window("JPCP", 50)
    assert (window.size, window.failures) == (50, 25), "outages not counted at all"
    assert len(RedisOutbox(client).pending()) == 1


def test_exa_bridge_status_reports_rate_window_cooldown_and_last_request(
    redis_server: str, client: redis.Redis, tmp_path: Path
) -> None:
    tracker = FailureTracker(RedisFailureStore(client), FailureSettings())
    for outcome in [Outcome.OK] * 10 + [Outcome.FAILURE] * 40:
        tracker.observe("JPCP", outcome)
    tracker.observe("CRCP", Outcome.OK)
    app = typer.Typer()
    app.command()(status)
    env = {"EXAMLOPS_REDIS__URL": redis_server, "EXAMLOPS_HOME": str(tmp_path)}
    result = CliRunner().invoke(app, ["--json"], env=env)
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert (data["window"], data["threshold"], data["cooldown_s"]) == (50, 0.5, 300.0)
    rows = {row["model"]: row for row in data["models"]}
    assert set(rows) == {"JPCP", "CRCP", "AC"}
    assert rows["JPCP"]["failure_rate"] == 0.8 and rows["JPCP"]["window_size"] == 50
    assert 290 < rows["JPCP"]["cooldown_left_s"] <= 300
    assert rows["JPCP"]["last_request"]["delivered_at"] is None
    assert rows["CRCP"]["window_size"] == 1 and rows["CRCP"]["last_request"] is None
    table = CliRunner().invoke(app, [], env=env)
    assert table.exit_code == 0 and "JPCP" in table.output and "50/50" in table.output


def test_exa_bridge_status_without_redis_exits_3(tmp_path: Path) -> None:
    app = typer.Typer()
    app.command()(status)
    env = {"EXAMLOPS_REDIS__URL": f"redis://127.0.0.1:{free_port()}/0", "EXAMLOPS_HOME": str(tmp_path)}
    assert CliRunner().invoke(app, [], env=env).exit_code == 3


def test_the_prefect_requester_reports_an_unreachable_control_plane_as_retryable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from examlops.core.errors import DependencyUnavailable

    monkeypatch.setenv("PREFECT_HOME", str(tmp_path / "prefect"))
    monkeypatch.setenv("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    requester = PrefectRetrainRequester(f"http://127.0.0.1:{free_port()}/api", timeout_s=2)
    with pytest.raises(DependencyUnavailable) as caught:
        requester.request("JPCP", "test", "examlops-retrain-jpcp-x")
    assert caught.value.retryable and "retrain/retrain" in str(caught.value)


def test_a_batched_push_leaves_the_windows_and_states_of_one_push_per_outcome(client: redis.Redis) -> None:
    store = RedisFailureStore(client)
    pattern = [("JPCP", True), ("AC", False), ("jpcp", False), ("JPCP", True), ("AC", True), ("JPCP", False)] * 3
    pattern.append(("AC", False))

    def run(batched: bool) -> tuple[list[WindowState], dict[str, list[str]], set[str]]:
        client.flushdb()
        for failed in (True, True, False, True, True, True):  # a window longer than the capacity pushed below
            store.push("JPCP", failed, 10)
        pushed = store.push_many if batched else lambda outcomes, n: [store.push(m, f, n) for m, f in outcomes]
        states = pushed(pattern, 4)
        windows = {model: client.lrange(f"examlops:failures:window:{model}", 0, -1) for model in ("jpcp", "ac")}
        return states, windows, set(client.smembers("examlops:failures:models"))

    assert run(batched=True) == run(batched=False)
    assert store.push_many([], 4) == []


def test_a_batched_push_retried_with_its_call_key_counts_nothing_twice(client: redis.Redis) -> None:
    store = RedisFailureStore(client)
    outcomes = [("JPCP", True), ("AC", False), ("JPCP", False), ("JPCP", True)]
    first = store.push_many(outcomes, 50, call_key="test:push:1")
    assert first == [WindowState(1, 1, 50), WindowState(1, 0, 50), WindowState(2, 1, 50), WindowState(3, 2, 50)]
    # Retried after its answer was lost: nothing is pushed, and the answer is the first one, so the same
    # states are due (a retrain is neither missed nor asked for once per outcome).
    assert store.push_many(outcomes, 50, call_key="test:push:1") == first
    assert client.llen("examlops:failures:window:jpcp") == 3 and client.llen("examlops:failures:window:ac") == 1
    assert store.push_many(outcomes[:1], 50, call_key="test:push:2") == [WindowState(4, 3, 50)], "a new call"
    assert 0 < client.pttl("test:push:1") <= 4_200_000
