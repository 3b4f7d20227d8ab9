from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from examlops.core.errors import Conflict, PromotionIncomplete
from examlops.loop import events
from examlops.loop.abort import abort_analysis
from examlops.loop.cycle import retrain_cycle
from examlops.loop.state import Phase
from tests.unit.loop.fakes import Loop, make_loop


@dataclass(frozen=True)
class Candidate:
    version: str = "3"
    alias: str = "Canary"
    moved: bool = True
    candidate_rmse: float = 0.1
    production_rmse: float | None = 0.2


def cycle(
    loop: Loop, *, from_trigger: bool = True, candidate: Candidate = Candidate(), analyse: Any = "default",
    requested_at: float | None = None,
) -> Any:  # fmt: skip
    calls: list[str] = []

    def retrain() -> Candidate:
        calls.append("retrain")
        return candidate

    def analysed() -> str:
        calls.append("analyse")
        return "analysis"

    chosen = analysed if analyse == "default" else analyse
    result = retrain_cycle(
        loop.parts, "JPCP", owner="run-9", run="flow run 9", from_trigger=from_trigger, retrain=retrain,
        analyse=chosen, reason="burst", requested_at=requested_at,
    )  # fmt: skip
    return result, calls


def test_a_better_candidate_goes_on_to_its_analysis_under_the_same_hold() -> None:
    loop = make_loop()
    result, calls = cycle(loop)
    assert result.action == "analysed" and calls == ["retrain", "analyse"]
    record = loop.store.get("JPCP")
    assert record is not None and record.owner == "run-9" and record.canary_version == "3"


def test_a_worse_candidate_is_kept_back_and_never_analysed() -> None:
    loop = make_loop()
    result, calls = cycle(loop, candidate=Candidate(moved=False, candidate_rmse=0.3))
    assert result.action == "kept_back" and calls == ["retrain"]
    assert loop.audit.types() == [events.CANDIDATE_KEPT_BACK]
    record = loop.store.get("JPCP")
    assert record is not None and record.phase is Phase.SERVING and record.owner is None


def test_a_trigger_while_a_loop_holds_the_model_is_dropped_and_says_so() -> None:
    loop = make_loop()
    loop.store.claim("JPCP", "other", Phase.CANARY, loop.clock.now, 120.0, run="flow run 1")
    result, calls = cycle(loop)
    assert result.action == "dropped" and calls == [] and "flow run 1" in result.note
    assert loop.audit.types() == [events.TRIGGER_DROPPED]
    with pytest.raises(Conflict):
        cycle(loop, from_trigger=False)


def test_a_hold_whose_run_died_is_taken_over() -> None:
    loop = make_loop()
    loop.store.claim("JPCP", "other", Phase.CANARY, loop.clock.now - 500, 120.0)
    result, _calls = cycle(loop)
    assert result.action == "analysed"


def promoted(loop: Loop, *, version: str = "2", replaced: str = "1") -> float:
    """The loop promoted ``version`` (replacing ``replaced``) now; returns when."""
    loop.versions.aliases["Production"] = version
    loop.promoter.previous["JPCP"] = replaced
    loop.store.claim("JPCP", "old", Phase.CANARY, loop.clock.now, 120.0, canary_version=version)
    loop.store.finish(
        "JPCP", "old", Phase.PROMOTED, loop.clock.now, promoted_at=loop.clock.now, replaced_version=replaced
    )
    return loop.clock.now


def test_a_trigger_within_the_grace_period_rolls_back_a_promoted_version_that_fails() -> None:
    loop = make_loop(grace_s=300.0)
    at = promoted(loop)
    loop.calls.add("2", at + 10, 25, outcome="failed", code="inference_failed")
    loop.calls.add("2", at + 10, 5)
    loop.clock.now += 100
    result, calls = cycle(loop)
    assert result.action == "rolled_back" and calls == [] and loop.promoter.rolled_back == ["JPCP"]
    assert loop.versions.aliases["Production"] == "1" and loop.failures.resets == [("JPCP", False)]
    assert loop.audit.types() == [events.ROLLED_BACK]
    record = loop.store.get("JPCP")
    assert record is not None and record.phase is Phase.ROLLED_BACK and record.promoted_at is None


def test_failures_of_another_version_or_a_request_older_than_the_promotion_roll_nothing_back() -> None:
    loop = make_loop(grace_s=300.0)
    at = promoted(loop)
    loop.calls.add("1", at + 1, 40, outcome="failed", code="inference_failed")  # the old version, in flight
    loop.calls.add("3", at + 5, 40, outcome="failed", code="inference_failed")  # a pinned alias's version
    loop.calls.add("2", at + 5, 30)
    loop.clock.now += 60
    result, calls = cycle(loop)
    assert result.action == "dropped" and calls == [] and "another version's" in result.note
    loop.calls.add("2", at + 20, 30, outcome="failed", code="inference_failed")
    old, _ = cycle(loop, requested_at=at - 1)
    assert old.action == "dropped" and "before the loop promoted" in old.note
    assert loop.promoter.rolled_back == [] and loop.versions.aliases["Production"] == "2"


def test_a_production_moved_by_someone_else_is_not_rolled_back() -> None:
    loop = make_loop(grace_s=300.0)
    at = promoted(loop)
    loop.calls.add("2", at + 10, 30, outcome="failed", code="inference_failed")
    loop.versions.aliases["Production"] = "5"  # an operator's `exa promote`
    loop.clock.now += 100
    with pytest.raises(Conflict):
        cycle(loop)
    record = loop.store.get("JPCP")
    assert loop.versions.aliases["Production"] == "5" and record is not None and record.phase is Phase.SERVING


def test_a_rollback_an_instance_did_not_follow_is_still_recorded_as_rolled_back() -> None:
    loop = make_loop(grace_s=300.0)
    at = promoted(loop)
    loop.calls.add("2", at + 10, 30, outcome="failed", code="inference_failed")
    loop.clock.now += 100

    def lagging(model: str, *, production: str) -> Any:
        loop.versions.aliases["Production"] = "1"
        raise PromotionIncomplete("http://b lags", confirmed=("http://a",), lagging={"http://b": "lags"})

    loop.promoter.rollback = lagging  # type: ignore[method-assign]
    with pytest.raises(PromotionIncomplete):
        cycle(loop)
    record = loop.store.get("JPCP")
    assert record is not None and record.phase is Phase.ROLLED_BACK and record.promoted_at is None
    assert "http://b lags" in record.note and loop.audit.types() == [events.ROLLED_BACK]


def test_an_abort_asked_during_the_retrain_stops_the_loop_before_its_analysis() -> None:
    loop = make_loop()

    def retrain_then_abort() -> Candidate:
        abort_analysis(loop.parts, "JPCP", actor="ops")
        return Candidate()

    result = retrain_cycle(loop.parts, "JPCP", owner="run-9", run="r", from_trigger=True, retrain=retrain_then_abort,
                           analyse=lambda: pytest.fail("analysed after an abort"))  # fmt: skip
    record = loop.store.get("JPCP")
    assert result.action == "aborted" and record is not None and record.phase is Phase.ABORTED


def test_an_analysis_that_fails_before_it_takes_the_hold_leaves_the_model_free() -> None:
    loop = make_loop()

    def broken() -> Any:
        raise RuntimeError("catalog error")

    with pytest.raises(RuntimeError):
        retrain_cycle(loop.parts, "JPCP", owner="run-9", run="r", from_trigger=True, retrain=Candidate, analyse=broken)
    record = loop.store.get("JPCP")
    assert record is not None and not record.phase.active and "catalog error" in record.note


def test_after_the_grace_period_or_for_an_operator_a_failure_means_a_retrain() -> None:
    loop = make_loop(grace_s=300.0)
    at = promoted(loop)
    loop.calls.add("2", at + 10, 30, outcome="failed", code="inference_failed")
    result, _ = cycle(loop, from_trigger=False)
    assert result.action == "analysed" and loop.promoter.rolled_back == []
    loop.store.finish("JPCP", "run-9", Phase.PROMOTED, loop.clock.now, promoted_at=loop.clock.now)
    loop.clock.now += 301
    result, _ = cycle(loop)
    assert result.action == "analysed" and loop.promoter.rolled_back == []


def test_without_auto_canary_the_candidate_waits_on_canary() -> None:
    loop = make_loop()
    result, calls = cycle(loop, analyse=None)
    assert result.action == "on_canary" and calls == ["retrain"] and "exa canary start JPCP" in result.note
    record = loop.store.get("JPCP")
    assert record is not None and not record.phase.active


def test_a_failed_retrain_ends_the_hold() -> None:
    loop = make_loop()

    def broken() -> Candidate:
        raise RuntimeError("MLflow is down")

    with pytest.raises(RuntimeError):
        retrain_cycle(loop.parts, "JPCP", owner="r", run="r", from_trigger=True, retrain=broken, analyse=None)
    record = loop.store.get("JPCP")
    assert record is not None and record.phase is Phase.SERVING and "MLflow is down" in record.note


def test_a_trigger_after_a_canary_run_died_puts_its_split_back_before_retraining() -> None:
    loop = make_loop()
    loop.store.claim("JPCP", "dead", Phase.CANARY, loop.clock.now, 120.0, restore={}, run="r0")
    loop.traffic.split = {"Production": 90, "Canary": 10}
    loop.clock.now += 500
    result, _calls = cycle(loop, analyse=None)
    assert result.action == "on_canary" and loop.traffic.split == {}
