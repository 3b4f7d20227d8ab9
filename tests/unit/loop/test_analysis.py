from __future__ import annotations

import pytest

from examlops.core.errors import Conflict, InvalidInput, NotFound, PromotionIncomplete
from examlops.loop import events
from examlops.loop.abort import abort_analysis
from examlops.loop.analysis import CanaryAnalysis
from examlops.loop.state import Phase
from tests.unit.loop.fakes import Loop, make_loop


def feed(loop: Loop, *, production_failed: int = 0, canary_failed: int = 0, per_second: int = 10) -> None:
    """Each simulated second: ``per_second`` Production calls and 2 Canary calls, some failing."""

    def tick(now: float) -> None:
        loop.calls.add("1", now, per_second - production_failed)
        loop.calls.add("1", now, production_failed, outcome="failed", code="inference_failed")
        loop.calls.add("2", now, 2 - canary_failed)
        loop.calls.add("2", now, canary_failed, outcome="failed", code="inference_failed")

    loop.clock.on_sleep.append(tick)


def test_a_passing_canary_is_promoted_the_split_restored_and_the_failure_window_reset() -> None:
    loop = make_loop()
    loop.traffic.split = {"Production": 100}
    feed(loop)
    load = loop.promoter.load

    def load_before_any_traffic(model: str, alias: str, version: str) -> tuple[str, ...]:
        assert loop.traffic.history == [], "Canary gets traffic only once every instance loaded it"
        return load(model, alias, version)

    loop.promoter.load = load_before_any_traffic  # type: ignore[method-assign]
    result = CanaryAnalysis(loop.parts).run("JPCP", owner="run-1", run="flow run 1")
    assert result.decision == "pass" and result.phase is Phase.PROMOTED
    assert loop.promoter.loaded == [("Canary", "2")]
    assert loop.traffic.history == [{"Production": 90, "Canary": 10}, {"Production": 100}]
    assert loop.promoter.promoted == ["JPCP"] and loop.versions.aliases["Production"] == "2"
    assert loop.failures.resets == [("JPCP", True)]
    record = loop.store.get("JPCP")
    assert record is not None and record.phase is Phase.PROMOTED and record.owner is None
    assert record.promoted_at == loop.clock.now and record.replaced_version == "1"
    assert loop.audit.types() == [events.CANARY_STARTED, events.DECIDED]
    decided = loop.audit.events[-1][2]
    assert decided["decision"] == "pass" and {g["gate"] for g in decided["gates"]} == {
        "failures",
        "latency",
        "drift",
        "refusals",
    }
    assert result.canary.requests >= 20 and result.decided_at - result.window_start >= 10.0


def test_the_window_opens_only_once_canary_is_loaded_and_every_instance_applies_the_split() -> None:
    loop = make_loop()
    loop.calls.add("2", loop.clock.now, 50, outcome="failed", code="inference_failed")  # before the window
    load = loop.promoter.load

    def slow_load(model: str, alias: str, version: str) -> tuple[str, ...]:
        loop.clock.now += 30  # instances take their time to load the new version
        return load(model, alias, version)

    loop.promoter.load = slow_load  # type: ignore[method-assign]
    feed(loop)
    result = CanaryAnalysis(loop.parts).run("JPCP", owner="run-1")
    assert result.decision == "pass"
    assert result.window_start == result.started_at + 30 + loop.traffic.settle_s


def test_a_failing_canary_gets_share_zero_and_production_stays() -> None:
    loop = make_loop()
    loop.traffic.split = {"Production": 80, "Canary": 20}
    feed(loop, canary_failed=1)
    result = CanaryAnalysis(loop.parts).run("JPCP", owner="run-1")
    assert result.decision == "fail" and result.phase is Phase.REJECTED
    assert loop.traffic.split == {"Production": 100}
    assert loop.promoter.promoted == [] and loop.versions.aliases["Production"] == "1" and loop.failures.resets == []
    decided = loop.audit.events[-1][2]
    assert decided["failed_gates"] == ["failures"]
    record = loop.store.get("JPCP")
    assert record is not None and "(failed failures: " in record.note  # `exa loop status` names the gate that failed


def test_drifted_canary_predictions_fail_it() -> None:
    loop = make_loop()
    feed(loop)
    loop.predictions.by_version = {"1": [0.0] * 100, "2": [1.0] * 40}
    loop.drift_p[0] = 1e-6
    result = CanaryAnalysis(loop.parts).run("JPCP", owner="run-1")
    assert result.decision == "fail" and [g.gate for g in result.gates if g.passed is False] == ["drift"]


def test_without_enough_traffic_by_the_time_limit_it_ends_undecided_and_changes_nothing() -> None:
    loop = make_loop(max_seconds=30.0)
    loop.traffic.split = {}
    result = CanaryAnalysis(loop.parts).run("JPCP", owner="run-1")
    assert result.decision == "undecided" and result.phase is Phase.UNDECIDED
    assert loop.traffic.split == {} and loop.promoter.promoted == []
    assert loop.clock.now - result.started_at >= 30.0


def test_an_abort_stops_the_analysis_and_restores_the_split() -> None:
    loop = make_loop(max_seconds=600.0)
    loop.traffic.split = {"Production": 100}
    asked_at = loop.clock.now + 5  # after the window opened, before it could decide

    def operator(now: float) -> None:
        record = loop.store.get("JPCP")
        if now >= asked_at and record is not None and not record.abort_requested:
            abort_analysis(loop.parts, "JPCP", actor="ops")

    loop.clock.on_sleep.append(operator)
    result = CanaryAnalysis(loop.parts).run("JPCP", owner="run-1")
    assert result.decision == "aborted" and result.phase is Phase.ABORTED
    assert loop.traffic.split == {"Production": 100} and loop.promoter.promoted == []


def test_an_abort_of_a_run_that_died_restores_its_split_here() -> None:
    loop = make_loop()
    loop.store.claim("JPCP", "gone", Phase.CANARY, loop.clock.now, 120.0, restore={"Production": 100}, run="r")
    loop.traffic.split = {"Production": 90, "Canary": 10}
    loop.clock.now += 500
    result = abort_analysis(loop.parts, "JPCP", actor="ops")
    assert result.how == "ended" and result.record.phase is Phase.ABORTED
    assert loop.traffic.split == {"Production": 100}
    with pytest.raises(NotFound):
        abort_analysis(loop.parts, "JPCP", actor="ops")


def test_a_model_another_live_run_holds_is_left_alone() -> None:
    loop = make_loop()
    loop.store.claim("JPCP", "other", Phase.RETRAINING, loop.clock.now, 120.0, run="flow run 7")
    with pytest.raises(Conflict, match="flow run 7"):
        CanaryAnalysis(loop.parts).run("JPCP", owner="run-1")
    assert loop.traffic.history == [] and loop.audit.events == []


def test_a_canary_an_instance_cannot_load_gets_no_traffic_and_the_analysis_ends_undecided() -> None:
    loop = make_loop()
    loop.traffic.split = {"Production": 100}

    def refused(model: str, alias: str, version: str) -> tuple[str, ...]:
        raise PromotionIncomplete(
            "http://b refused version 2", confirmed=("http://a",), lagging={"http://b": "refused"}
        )

    loop.promoter.load = refused  # type: ignore[method-assign]
    with pytest.raises(PromotionIncomplete):
        CanaryAnalysis(loop.parts).run("JPCP", owner="run-1")
    record = loop.store.get("JPCP")
    assert loop.traffic.history == [{"Production": 100}] and loop.traffic.split == {"Production": 100}
    assert record is not None and record.phase is Phase.UNDECIDED and "refused" in record.note


def test_canary_and_production_on_one_version_is_bad_input() -> None:
    loop = make_loop()
    loop.versions.aliases["Canary"] = "1"
    with pytest.raises(InvalidInput):
        CanaryAnalysis(loop.parts).run("JPCP", owner="run-1")


def test_an_unset_canary_is_bad_input_and_nothing_is_held() -> None:
    loop = make_loop()
    del loop.versions.aliases["Canary"]
    with pytest.raises(InvalidInput, match="Canary is not set: nothing to analyse"):
        CanaryAnalysis(loop.parts).run("JPCP", owner="run-1")
    assert loop.store.get("JPCP") is None and loop.traffic.history == [] and loop.audit.events == []


def test_an_error_during_the_window_restores_the_split_and_ends_the_hold() -> None:
    loop = make_loop()
    loop.traffic.split = {"Production": 100}

    def broken(model: str, since: float) -> list:  # type: ignore[type-arg]
        raise RuntimeError("the trace store is down")

    loop.calls.calls = broken  # type: ignore[method-assign]
    with pytest.raises(RuntimeError):
        CanaryAnalysis(loop.parts).run("JPCP", owner="run-1")
    record = loop.store.get("JPCP")
    assert loop.traffic.split == {"Production": 100}
    assert record is not None and record.phase is Phase.UNDECIDED and "down" in record.note


def test_a_dead_canary_runs_split_is_put_back_before_a_new_analysis_takes_the_model() -> None:
    loop = make_loop()
    loop.traffic.split = {"Production": 100}
    loop.store.claim("JPCP", "dead", Phase.CANARY, loop.clock.now, 120.0, restore={"Production": 100}, run="r0")
    loop.traffic.split = {"Production": 90, "Canary": 10}  # the dead run's
    loop.clock.now += 500
    feed(loop)
    result = CanaryAnalysis(loop.parts).run("JPCP", owner="run-1")
    assert result.decision == "pass"
    assert loop.traffic.history[0] == {"Production": 100}, "the dead run's split went back first"
    assert loop.traffic.split == {"Production": 100}, "and the new run restored the site's split, not the dead run's"
    assert "aborted" in [d.get("decision") for t, _s, d in loop.audit.events if t == events.DECIDED]
