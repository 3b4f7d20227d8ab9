"""What an analysis saw: ``Window`` (the figures of both versions, the drift, the gates, the verdict at one
look) and ``AnalysisResult`` (how the analysis ended, and what it did)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from examlops.loop.figures import VersionFigures
from examlops.loop.gates import Decision, DriftFigure, GateResult
from examlops.loop.ports import Promotion
from examlops.loop.state import Phase

Ending = Literal["pass", "fail", "undecided", "aborted", "error"]


@dataclass(frozen=True, slots=True)
class Window:
    production: VersionFigures
    canary: VersionFigures
    drift: DriftFigure
    gates: tuple[GateResult, ...]
    decision: Decision

    def figures(self, elapsed_s: float) -> dict[str, Any]:
        return {
            "elapsed_s": round(elapsed_s, 1),
            "production": self.production.to_json(),
            "canary": self.canary.to_json(),
            "drift": drift_json(self.drift),
            "gates": [gate.to_json() for gate in self.gates],
            "decision": self.decision,
        }


@dataclass(frozen=True, slots=True)
class AnalysisResult:
    model: str
    decision: Ending
    phase: Phase
    production: VersionFigures
    canary: VersionFigures
    drift: DriftFigure
    gates: tuple[GateResult, ...]
    share: int
    started_at: float
    window_start: float
    decided_at: float
    promotion: Promotion | None = None
    note: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "decision": self.decision,
            "phase": self.phase.value,
            "production": self.production.to_json(),
            "canary": self.canary.to_json(),
            "drift": drift_json(self.drift),
            "failed_gates": [gate.gate for gate in self.gates if gate.passed is False],
            "gates": [gate.to_json() for gate in self.gates],
            "share": self.share,
            "started_at": self.started_at,
            "window_start": self.window_start,
            "decided_at": self.decided_at,
            "promotion": None if self.promotion is None else {
                "old_version": self.promotion.old_version, "new_version": self.promotion.new_version,
                "instances": list(self.promotion.instances)},
            "note": self.note,
        }  # fmt: skip


def drift_json(drift: DriftFigure) -> dict[str, Any]:
    return {"p_value": drift.p_value, "distance": drift.distance, "canary_rows": drift.canary_rows,
            "production_rows": drift.production_rows}  # fmt: skip
