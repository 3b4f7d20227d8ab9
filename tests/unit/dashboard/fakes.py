"""Fakes at the dashboard's ports: they record what they were asked and can be steered."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from examlops.core.errors import StoreUnavailable
from examlops.dashboard.ports import AuditCheck, AuditEntry, DriftPoint, FailureWindow, FlowRun, Moved
from examlops.serving.hotset import EntryInfo
from tests.unit.api.test_ingress import FakePipeline


@dataclass
class HotPipeline(FakePipeline):
    """The API's fake pipeline with a hot set and a stored split per model."""

    splits: dict[str, dict[str, int]] = field(default_factory=dict)

    def hot_set(self) -> Sequence[Any]:
        return [
            EntryInfo(name, alias, version, f"run-{name}-{version}", 1.7e9, "ready")
            for name in self.catalog.names
            for alias, version in (("Production", "1"), ("Canary", "2"))
        ]

    def traffic(self, model: str) -> dict[str, int]:
        return dict(self.splits.get(model, {}))

    def set_traffic(self, model: str, weights: Mapping[str, int], actor: str = "") -> dict[str, int]:
        super().set_traffic(model, weights, actor)
        self.splits[model] = dict(weights)
        return dict(weights)


@dataclass
class InMemoryAudit:
    """The trail's events and the last stored verify result; ``walks`` counts full verifies asked of it."""

    events: list[AuditEntry] = field(default_factory=list)
    stored: AuditCheck | None = None
    walks: int = 0

    def tail(self, n: int) -> list[AuditEntry]:
        return self.events[-n:]

    def last_check(self) -> AuditCheck | None:
        return self.stored

    def verify(self) -> AuditCheck:
        """A walk of the whole chain: what serving must never run."""
        self.walks += 1
        return AuditCheck(len(self.events), 1, None)

    def add(self, type: str, subject: str, actor: str) -> None:
        self.events.append(AuditEntry(len(self.events) + 1, "2026-12-02T06:00:00+00:00", type, subject, actor, "{}"))


@dataclass
class FixedDrift:
    points: list[DriftPoint] = field(default_factory=list)

    def history(self, model: str, limit: int) -> list[DriftPoint]:
        return [p for p in self.points if p.model == model][-limit:]


@dataclass
class FixedFailures:
    windows_by_model: dict[str, FailureWindow] = field(default_factory=dict)
    down: bool = False

    def windows(self, models: Sequence[str]) -> dict[str, FailureWindow]:
        if self.down:
            raise StoreUnavailable("redis is down")
        return {m: w for m, w in self.windows_by_model.items() if m in models}


@dataclass
class FixedLoops:
    rows: dict[str, dict[str, Any]] = field(default_factory=dict)

    def records(self) -> dict[str, dict[str, Any]]:
        return self.rows


@dataclass
class RecordingPromoter:
    """Promotes in memory and appends the ``alias.moved`` event naming the actor, as the real hook does."""

    audit: InMemoryAudit
    asked: list[tuple[str, str, str]] = field(default_factory=list)
    warnings: tuple[str, ...] = ()
    canary_is_production: bool = False
    """Canary points where Production does: a promotion moves nothing."""

    def promote_canary(self, model: str, actor: str) -> Moved:
        self.asked.append(("promote", model, actor))
        if self.canary_is_production:
            return Moved(model, "2", "2", (), nothing_to_do=True)
        self.audit.add("alias.moved", model, actor)
        return Moved(model, "1", "2", ("http://serving",), self.warnings)

    def rollback(self, model: str, actor: str) -> Moved:
        self.asked.append(("rollback", model, actor))
        self.audit.add("alias.moved", model, actor)
        return Moved(model, "2", "1", ("http://serving",))


@dataclass
class FixedRuns:
    """Prefect's flow runs, each with the model its parameters name."""

    named: list[tuple[str, FlowRun]] = field(default_factory=list)

    def runs(self, model: str, limit: int) -> list[FlowRun]:
        return [run for name, run in self.named if name == model][:limit]
