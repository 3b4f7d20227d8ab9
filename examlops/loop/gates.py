"""The canary's gates: each compares Canary with Production over the same window and passes, fails, or is
not judged (too little to go on), and ``verdict`` turns them into a decision.

Gates (their limits are ``LoopSettings``):

- ``failures``: Canary's model-failure rate is at most Production's plus ``failure_margin``, and never above
  ``max_failure_rate`` whatever Production does (a broken Production is no standard to meet);
- ``latency``: Canary's p99 is at most ``p99_ratio`` times Production's plus ``p99_slack_ms`` (not judged
  when either version answered nothing). Until Canary answered ``p99_min_answers`` calls the gate compares
  p95 instead: the p99 of a hundred calls is about their second largest (bench/RESULTS.md, issue 20);
- ``drift``: Canary's predictions do not differ from Production's in the same window: drift is a two-sample
  K-S p-value below ``drift_p_value`` and a K-S distance of at least ``drift_min_distance`` (a p-value alone
  finds any difference once traffic is large); not judged with fewer than ``drift_min_rows`` bus
  predictions of either version. Both versions see the same traffic (the split draws at random), so a
  difference is the model's, not the traffic's;
- ``refusals``: Canary's share of late budget refusals is at most Production's plus ``refusal_margin``.

``verdict``: ``undecided`` until the window holds ``min_requests`` Canary calls and ``min_seconds`` have
passed; then ``pass`` when no gate failed, else ``fail``. A gate that is not judged never fails a canary.
A Canary whose model failures already exceed ``max_failure_rate`` of ``min_requests`` fails at once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

from examlops.core.settings import LoopSettings
from examlops.loop.figures import VersionFigures

Decision = Literal["pass", "fail", "undecided"]


@dataclass(frozen=True, slots=True)
class DriftFigure:
    """Canary's bus predictions against Production's in the window: the K-S p-value and distance (None when
    not computed)."""

    p_value: float | None
    canary_rows: int
    production_rows: int
    distance: float | None = None


@dataclass(frozen=True, slots=True)
class GateResult:
    gate: str
    passed: bool | None
    """None: not judged (too little to go on); it never fails a canary."""
    canary: float | None
    production: float | None
    limit: float | None
    detail: str

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def judge(
    production: VersionFigures, canary: VersionFigures, drift: DriftFigure, settings: LoopSettings
) -> tuple[GateResult, ...]:
    """Every gate of ``canary`` against ``production`` (module docstring)."""
    return (
        _failures(production, canary, settings),
        _latency(production, canary, settings),
        _drift(drift, settings),
        _refusals(production, canary, settings),
    )


def verdict(gates: Sequence[GateResult], canary: VersionFigures, elapsed_s: float, settings: LoopSettings) -> Decision:
    if canary.model_failures > settings.max_failure_rate * settings.min_requests:
        return "fail"  # more calls cannot bring it under the ceiling within the minimum
    if canary.requests < settings.min_requests or elapsed_s < settings.min_seconds:
        return "undecided"
    return "fail" if any(gate.passed is False for gate in gates) else "pass"


def _failures(production: VersionFigures, canary: VersionFigures, settings: LoopSettings) -> GateResult:
    limit = min(production.failure_rate + settings.failure_margin, settings.max_failure_rate)
    if not canary.requests:
        return GateResult("failures", None, None, production.failure_rate, limit, "Canary had no call")
    passed = canary.failure_rate <= limit
    detail = (
        f"model-failure rate {canary.failure_rate:.3f} ({canary.model_failures}/{canary.requests}) against "
        f"Production's {production.failure_rate:.3f} ({production.model_failures}/{production.requests}); "
        f"limit {limit:.3f} (Production's + {settings.failure_margin:g}, at most {settings.max_failure_rate:g})"
    )
    return GateResult("failures", passed, canary.failure_rate, production.failure_rate, limit, detail)


def _latency(production: VersionFigures, canary: VersionFigures, settings: LoopSettings) -> GateResult:
    if canary.p99_ms is None or production.p99_ms is None:
        who = "Canary" if canary.p99_ms is None else "Production"
        return GateResult("latency", None, canary.p99_ms, production.p99_ms, None, f"{who} answered no call")
    name, ours, theirs = "p99", canary.p99_ms, production.p99_ms
    if canary.answered < settings.p99_min_answers:  # the p99 of a hundred calls is about their second largest
        name, ours, theirs = "p95", canary.p95_ms or 0.0, production.p95_ms or 0.0
    limit = settings.p99_ratio * theirs + settings.p99_slack_ms
    detail = (
        f"{name} {ours:.1f} ms against Production's {theirs:.1f} ms; "
        f"limit {settings.p99_ratio:g} x + {settings.p99_slack_ms:g} ms = {limit:.1f} ms"
        + ("" if name == "p99" else f" (p95: Canary answered {canary.answered} < {settings.p99_min_answers} calls)")
    )
    return GateResult("latency", ours <= limit, ours, theirs, limit, detail)


def _drift(drift: DriftFigure, settings: LoopSettings) -> GateResult:
    rows = min(drift.canary_rows, drift.production_rows)
    if drift.p_value is None or rows < settings.drift_min_rows:
        detail = (
            f"{drift.canary_rows} Canary and {drift.production_rows} Production bus predictions in the window; "
            f"{settings.drift_min_rows} of each are needed"
        )
        return GateResult("drift", None, drift.p_value, None, settings.drift_p_value, detail)
    distance = drift.distance or 0.0
    passed = drift.p_value >= settings.drift_p_value or distance < settings.drift_min_distance
    detail = (
        f"K-S p-value {drift.p_value:.4g}, distance {distance:.3f} of Canary's {drift.canary_rows} predictions "
        f"against Production's {drift.production_rows}; drift below p {settings.drift_p_value:g} with a distance "
        f"of {settings.drift_min_distance:g} or more"
    )
    return GateResult("drift", passed, drift.p_value, None, settings.drift_p_value, detail)


def _refusals(production: VersionFigures, canary: VersionFigures, settings: LoopSettings) -> GateResult:
    limit = production.refusal_rate + settings.refusal_margin
    if not canary.requests:
        return GateResult("refusals", None, None, production.refusal_rate, limit, "Canary had no call")
    detail = (
        f"late budget refusals {canary.refusal_rate:.3f} ({canary.late_refusals}/{canary.requests}) against "
        f"Production's {production.refusal_rate:.3f}; limit {limit:.3f}"
    )
    return GateResult(
        "refusals", canary.refusal_rate <= limit, canary.refusal_rate, production.refusal_rate, limit, detail
    )
