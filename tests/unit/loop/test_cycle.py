from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from examlops.core.errors import Conflict
from examlops.loop import events
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
    loop: Loop, *, from_trigger: bool = True, candidate: Candidate = Candidate(), analyse: Any = "default"
) -> Any:
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
        analyse=chosen, reason="burst",
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


def test_a_trigger_within_the_grace_period_of_the_loops_promotion_rolls_it_back() -> None:
    loop = make_loop(grace_s=300.0)
    loop.versions.aliases["Production"] = "2"
    loop.promoter.previous["JPCP"] = "1"
    loop.store.claim("JPCP", "old", Phase.CANARY, loop.clock.now, 120.0, canary_version="2")
    loop.store.finish("JPCP", "old", Phase.PROMOTED, loop.clock.now, promoted_at=loop.clock.now, replaced_version="1")
    loop.clock.now += 100
    result, calls = cycle(loop)
    assert result.action == "rolled_back" and calls == [] and loop.promoter.rolled_back == ["JPCP"]
    assert loop.versions.aliases["Production"] == "1" and loop.failures.resets == [("JPCP", False)]
    assert loop.audit.types() == [events.ROLLED_BACK]
    record = loop.store.get("JPCP")
    assert record is not None and record.phase is Phase.ROLLED_BACK and record.promoted_at is None


def test_after_the_grace_period_or_for_an_operator_a_failure_means_a_retrain() -> None:
    loop = make_loop(grace_s=300.0)
    loop.store.claim("JPCP", "old", Phase.CANARY, loop.clock.now, 120.0)
    loop.store.finish("JPCP", "old", Phase.PROMOTED, loop.clock.now, promoted_at=loop.clock.now)
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
