"""Budgets on the bus (seed 001): signed with the job, only tightening across the hop, refusals passed on."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from examlops.bus import budget, wire
from examlops.bus.hop import ModelHandler
from examlops.core.errors import InvalidInput
from examlops.core.settings import HttpSettings
from examlops.monitoring.failures import Outcome, classify
from examlops.registry.catalog import load_catalog

SECRET = b"unit-test-bus-key-of-identity-a"
KEY_ID = "keyida01"
ADDRESS = "57dcdb81-15d8-5512-8e93-3f86bc59ad53"
NOW = 1_700_000_000.0
REPLY_TO = wire.replies_stream("client-1")
SPEC = load_catalog(Path(__file__).resolve().parents[3] / "examlops" / "catalog").get("JPCP")


def signed(**overrides: Any) -> dict[str, str]:
    args: dict[str, Any] = {
        "address": ADDRESS,
        "job_id": "job-1",
        "reply_to": REPLY_TO,
        "deadline": NOW + 5,
        "payload": {"node_count": 3, "embedding": [0.1]},
        "submitted": NOW,
        "budget_ms": 200.0,
    }
    return wire.encode_job(KEY_ID, SECRET, **(args | overrides))


def test_a_jobs_deadline_is_the_earlier_of_its_own_and_its_submission_plus_its_budget() -> None:
    tight = wire.decode_job(SECRET, ADDRESS, signed(), NOW)
    assert (tight.deadline, tight.budget_ms, tight.submitted_at) == (NOW + 0.2, 200.0, NOW)
    loose = wire.decode_job(SECRET, ADDRESS, signed(budget_ms=60_000.0), NOW)
    assert loose.deadline == NOW + 5


@pytest.mark.parametrize("field, value", [("budget_ms", "900000.0"), ("submitted", repr(NOW + 100))])
def test_a_budget_or_submission_time_altered_after_signing_fails_the_signature(field: str, value: str) -> None:
    with pytest.raises(wire.BadSignature):
        wire.decode_job(SECRET, ADDRESS, {**signed(), field: value}, NOW)


def test_a_budget_stripped_from_a_signed_job_fails_the_signature() -> None:
    fields = signed()
    del fields["budget_ms"], fields["submitted"]
    with pytest.raises(wire.BadSignature):
        wire.decode_job(SECRET, ADDRESS, fields, NOW)


def test_a_job_without_a_budget_signs_as_before_and_has_none() -> None:
    fields = signed(submitted=None, budget_ms=None)
    assert "budget_ms" not in fields and "submitted" not in fields
    job = wire.decode_job(SECRET, ADDRESS, fields, NOW)
    assert (job.deadline, job.budget_ms) == (NOW + 5, None)


@pytest.mark.parametrize("budget", [0.0, -1.0, float("nan"), budget.MAX_JOB_BUDGET_MS + 1])
def test_a_budget_that_is_not_a_positive_number_of_milliseconds_cannot_be_sent(budget: float) -> None:
    with pytest.raises(InvalidInput, match="budget"):
        signed(budget_ms=budget)


def test_a_tasks_default_budget_counts_from_the_submission_and_never_replaces_the_jobs_own() -> None:
    own = wire.decode_job(SECRET, ADDRESS, signed(), NOW)
    assert own.with_default_budget(50.0, NOW) is own
    bare = wire.decode_job(SECRET, ADDRESS, signed(budget_ms=None), NOW)
    defaulted = bare.with_default_budget(50.0, NOW + 3)  # the job's own submission time wins over the entry's
    assert (defaulted.budget_ms, defaulted.deadline) == (50.0, NOW + 0.05)
    assert bare.with_default_budget(50_000.0, NOW).deadline == NOW + 5  # a long default never extends it
    legacy = wire.decode_job(SECRET, ADDRESS, signed(submitted=None, budget_ms=None), NOW)
    assert legacy.with_default_budget(50.0, budget.entry_time("1700000000100-0")).deadline == NOW + 0.1 + 0.05


def job(*, budget_ms: float | None, deadline_in: float = 30.0) -> wire.Job:
    now = time.time()
    fields = wire.encode_job(
        KEY_ID,
        SECRET,
        address=str(SPEC.seanerbus_uuid),
        job_id="j-1",
        reply_to=REPLY_TO,
        deadline=now + deadline_in,
        payload={"embedding": [0.01] * SPEC.embedding_dim, "node_count": 12},
        submitted=now,
        budget_ms=budget_ms,
    )
    return wire.decode_job(SECRET, str(SPEC.seanerbus_uuid), fields, now)


class Serving:
    """Serving at httpx's mock transport (the network's seam): keeps each request's body, answers ``reply``."""

    def __init__(self, status: int, reply: dict[str, Any], headers: dict[str, str] | None = None) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.status, self.reply, self.headers = status, reply, headers or {}

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.bodies.append(json.loads(request.content))
        return httpx.Response(self.status, json=self.reply, headers=self.headers)

    def handler(
        self, *, task: str | None = None, budget_ms: float | None = None, clock: Any = time.time
    ) -> ModelHandler:
        http = httpx.AsyncClient(transport=httpx.MockTransport(self))
        return ModelHandler(SPEC, http, "http://serving", HttpSettings(), clock, task=task, budget_ms=budget_ms)


ANSWER = {"model": "JPCP", "alias": "Production", "prediction": 0.25, "job_id": "j-1", "budget_ms": 1.0}


async def test_serving_gets_what_is_left_of_the_budget_never_more_and_no_absolute_deadline() -> None:
    serving = Serving(200, ANSWER)
    one = job(budget_ms=500.0)
    assert one.submitted_at is not None
    at_hop = one.submitted_at + 0.1234  # the job spent 123.4 ms reaching the hop
    outcome = await serving.handler(clock=lambda: at_hop).handle(one)
    [sent] = serving.bodies
    assert "deadline" not in sent  # serving's wall clock is not the bus's: it counts the budget from receipt
    assert sent["budget_ms"] <= (one.deadline - at_hop) * 1000.0 and sent["budget_ms"] == pytest.approx(376.6)
    assert outcome.body["budget_ms"] == 500.0  # the job's budget, not what serving was given
    assert outcome.body["budget_remaining_ms"] == pytest.approx(376.6)


async def test_a_job_without_a_budget_sends_what_is_left_of_its_timeout_and_its_answer_says_what_was_left() -> None:
    serving = Serving(200, ANSWER)
    bare = job(budget_ms=None, deadline_in=30.0)
    at_hop = bare.deadline - 12.34567
    outcome = await serving.handler(clock=lambda: at_hop).handle(bare)
    [sent] = serving.bodies
    assert "deadline" not in sent and sent["budget_ms"] == pytest.approx(12345.6)
    assert outcome.body["budget_ms"] is None and outcome.body["budget_remaining_ms"] == pytest.approx(12345.7)


async def test_a_job_past_its_deadline_at_the_hop_is_not_posted_and_not_recorded() -> None:
    serving = Serving(200, ANSWER)
    late = job(budget_ms=None)
    outcome = await serving.handler(clock=lambda: late.deadline).handle(late)
    assert serving.bodies == []
    assert outcome.body["code"] == "deadline_exceeded" and not outcome.recorded


async def test_a_task_job_without_a_budget_is_given_the_tasks_default_from_its_submission() -> None:
    serving = Serving(200, ANSWER)
    handler = serving.handler(task="pavement.distress.jpcp", budget_ms=400.0)
    bare = job(budget_ms=None)
    defaulted = handler.budgeted(bare, None)
    assert bare.submitted_at is not None
    assert defaulted.budget_ms == 400.0 and defaulted.deadline == pytest.approx(bare.submitted_at + 0.4)
    await handler.handle(defaulted)
    assert 0 < serving.bodies[0]["budget_ms"] <= 400.0
    assert handler.budgeted(job(budget_ms=100.0), None).budget_ms == 100.0  # the job's own budget stays


async def test_a_job_whose_budget_ran_out_is_not_posted_and_not_recorded() -> None:
    serving = Serving(200, ANSWER)
    outcome = await serving.handler().handle(job(budget_ms=0.001))
    assert serving.bodies == []
    assert outcome.body["code"] == "deadline_exceeded" and not outcome.recorded


@pytest.mark.parametrize("reason", ["budget", "late"])
async def test_a_refusal_from_serving_is_a_refused_reply_with_its_reason_and_estimate_never_recorded(
    reason: str,
) -> None:
    refusal = {"error": "no placement can meet the budget", "code": "refused", "refused": reason, "estimate_ms": 42.5}
    serving = Serving(503, {**refusal, "prediction": 0.0, "inference_failed": False}, {"Retry-After": "2"})
    outcome = await serving.handler(task="pavement.distress.jpcp").handle(job(budget_ms=300.0))
    body = outcome.body
    assert (body["code"], body["refused"], body["estimate_ms"], body["retry_after_s"]) == ("refused", reason, 42.5, 2)
    assert body["task"] == "pavement.distress.jpcp" and body["budget_ms"] == 300.0
    assert not outcome.recorded and not outcome.verdict and outcome.status == 503
    assert classify(outcome.status, body) is Outcome.IGNORED  # never counted toward the retrain trigger
