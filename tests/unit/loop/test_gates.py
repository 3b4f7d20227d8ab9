from __future__ import annotations

from examlops.core.settings import LoopSettings
from examlops.loop.figures import CallSample, figures_of
from examlops.loop.gates import DriftFigure, judge, verdict

SETTINGS = LoopSettings(min_requests=10, min_seconds=5.0, p99_min_answers=100)


def calls(version: str, answered: int, failed: int = 0, *, used_ms: float = 5.0, late: int = 0) -> list[CallSample]:
    return (
        [CallSample(version, "answered", "", used_ms, 0.0)] * answered
        + [CallSample(version, "failed", "inference_failed", 1.0, 0.0)] * failed
        + [CallSample(version, "refused", "refused", 1.0, 0.0)] * late
    )


def gates_of(
    production: list[CallSample], canary: list[CallSample], drift: DriftFigure | None = None
) -> dict[str, bool | None]:
    samples = production + canary
    result = judge(figures_of(samples, "1"), figures_of(samples, "2"), drift or DriftFigure(None, 0, 0), SETTINGS)
    return {gate.gate: gate.passed for gate in result}


def test_figures_count_model_failures_and_late_refusals_apart_and_take_percentiles_over_answers() -> None:
    samples = [*calls("2", 98, 1, late=1), CallSample("2", "refused", "invalid_input", 0.0, 0.0)]
    samples += [CallSample("2", "answered", "", 500.0, 0.0)] * 2
    figures = figures_of(samples, "2")
    assert (figures.requests, figures.answered, figures.model_failures, figures.late_refusals) == (103, 100, 1, 1)
    assert figures.p50_ms == 5.0 and figures.p99_ms is not None and figures.p99_ms > 5.0
    assert figures_of(samples, "9").p99_ms is None


def test_a_canary_failing_more_than_production_plus_the_margin_fails_the_failure_gate() -> None:
    assert gates_of(calls("1", 100), calls("2", 95, 5))["failures"] is False
    assert gates_of(calls("1", 100), calls("2", 99, 1))["failures"] is True  # 1 % within the 2 % margin
    assert gates_of(calls("1", 0, 100), calls("2", 100))["failures"] is True  # a failing Production: Canary is better


def test_the_latency_gate_compares_p99_with_ratio_and_slack_and_is_not_judged_without_answers() -> None:
    assert gates_of(calls("1", 100, used_ms=100.0), calls("2", 100, used_ms=125.0))["latency"] is True  # 120 + 10
    assert gates_of(calls("1", 100, used_ms=100.0), calls("2", 100, used_ms=131.0))["latency"] is False
    assert gates_of(calls("1", 0, 100), calls("2", 100))["latency"] is None


def test_the_drift_gate_needs_rows_of_both_versions_and_a_low_p_value_with_a_real_distance() -> None:
    assert gates_of(calls("1", 50), calls("2", 50), DriftFigure(0.001, 10, 300, 0.5))["drift"] is None
    assert gates_of(calls("1", 50), calls("2", 50), DriftFigure(0.001, 40, 300, 0.5))["drift"] is False
    assert gates_of(calls("1", 50), calls("2", 50), DriftFigure(0.2, 40, 300, 0.5))["drift"] is True
    assert gates_of(calls("1", 50), calls("2", 50), DriftFigure(1e-9, 4000, 30000, 0.04))["drift"] is True  # tiny


def test_a_canary_above_the_failure_ceiling_fails_however_badly_production_does_and_at_once() -> None:
    assert gates_of(calls("1", 0, 900), calls("2", 50, 50))["failures"] is False
    canary = figures_of(calls("2", 3, 2), "2")  # 2 failures > 0.1 x 10 calls: no more calls can save it
    gates = judge(figures_of(calls("1", 0, 100), "1"), canary, DriftFigure(None, 0, 0), SETTINGS)
    assert verdict(gates, canary, 0.0, SETTINGS) == "fail"


def test_below_the_minimum_of_answers_the_latency_gate_compares_p95_so_two_slow_calls_decide_nothing() -> None:
    production = calls("1", 1000, used_ms=10.0)
    canary = calls("2", 97, used_ms=10.0) + calls("2", 3, used_ms=900.0)  # its p99 is a tail of three calls
    few = judge(figures_of(production, "1"), figures_of(canary, "2"), DriftFigure(None, 0, 0),
                LoopSettings(p99_min_answers=300))  # fmt: skip
    [latency] = [gate for gate in few if gate.gate == "latency"]
    assert latency.passed is True and latency.detail.startswith("p95") and "answered 100 < 300" in latency.detail
    assert gates_of(production, canary)["latency"] is False  # with 100 answers enough, the p99 decides


def test_late_refusals_of_canary_beyond_production_fail_the_refusal_gate() -> None:
    assert gates_of(calls("1", 100), calls("2", 90, late=10))["refusals"] is False
    assert gates_of(calls("1", 90, late=10), calls("2", 90, late=10))["refusals"] is True


def test_the_verdict_waits_for_enough_canary_calls_and_time_and_a_not_judged_gate_never_fails() -> None:
    samples = calls("1", 100, 100) + calls("2", 20)
    production, canary = figures_of(samples, "1"), figures_of(samples, "2")
    gates = judge(production, canary, DriftFigure(None, 0, 0), SETTINGS)
    assert verdict(gates, canary, 4.0, SETTINGS) == "undecided"
    assert verdict(gates, figures_of(calls("2", 9), "2"), 100.0, SETTINGS) == "undecided"
    assert verdict(gates, canary, 5.0, SETTINGS) == "pass"
