"""Fakes at the closed loop's own ports (``examlops.loop.ports`` and ``state.LoopStore``), and a clock."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from examlops.core.errors import AliasNotFound, Conflict
from examlops.core.settings import LoopSettings
from examlops.loop.figures import CallSample
from examlops.loop.ports import LoopParts, Promotion
from examlops.loop.state import LoopRecord, Phase


class Clock:
    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now
        self.on_sleep: list[Callable[[float], None]] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds
        for hook in self.on_sleep:
            hook(self.now)


class FakeLoopStore:
    """``LoopStore`` in memory, with the same hold rules as the SQL adapter."""

    def __init__(self) -> None:
        self.records: dict[str, LoopRecord] = {}

    def get(self, model: str) -> LoopRecord | None:
        return self.records.get(model)

    def list(self) -> list[LoopRecord]:
        return sorted(self.records.values(), key=lambda r: r.model)

    def claim(
        self, model: str, owner: str, phase: Phase, now: float, lease_s: float, **values: Any
    ) -> LoopRecord | None:
        current = self.records.get(model)
        free = (
            current is None or not current.phase.active or current.owner == owner or current.updated_at < now - lease_s
        )
        if not free:
            return None
        base = current or LoopRecord(model, phase)
        kept = current is not None and current.owner == owner and current.abort_requested
        record = replace(base, **values, phase=phase, owner=owner, updated_at=now, abort_requested=kept)
        self.records[model] = record
        return record

    def update(self, model: str, owner: str, now: float, **values: Any) -> LoopRecord | None:
        current = self.records.get(model)
        if current is None or current.owner != owner or not current.phase.active:
            return None
        self.records[model] = replace(current, **values, updated_at=now)
        return self.records[model]

    def finish(self, model: str, owner: str, phase: Phase, now: float, **values: Any) -> LoopRecord | None:
        current = self.records.get(model)
        if current is None or current.owner != owner or not current.phase.active:
            return None
        self.records[model] = replace(current, **values, phase=phase, owner=None, updated_at=now, abort_requested=False)
        return self.records[model]

    def request_abort(self, model: str, now: float) -> LoopRecord | None:
        current = self.records.get(model)
        if current is None or not current.phase.active:
            return None
        self.records[model] = replace(current, abort_requested=True)
        return self.records[model]


@dataclass
class FakeVersions:
    aliases: dict[str, str] = field(default_factory=lambda: {"Production": "1", "Canary": "2"})

    def version(self, model: str, alias: str) -> str:
        if alias not in self.aliases:
            raise AliasNotFound(f"{model} has no {alias}")
        return self.aliases[alias]


@dataclass
class FakeTraffic:
    split: dict[str, int] = field(default_factory=dict)
    history: list[dict[str, int]] = field(default_factory=list)
    settle_s: float = 2.0

    def get(self, model: str) -> dict[str, int]:
        return dict(self.split)

    def set(self, model: str, weights: Mapping[str, int]) -> None:
        self.split = dict(weights)
        self.history.append(dict(weights))


@dataclass
class FakeCalls:
    samples: list[CallSample] = field(default_factory=list)

    def calls(self, model: str, since: float) -> list[CallSample]:
        return [s for s in self.samples if s.at >= since]

    def add(
        self, version: str, at: float, n: int, *, outcome: str = "answered", code: str = "", used_ms: float = 5.0
    ) -> None:
        self.samples += [CallSample(version, outcome, code, used_ms, at) for _ in range(n)]


@dataclass
class FakePredictions:
    by_version: dict[str, list[float]] = field(default_factory=dict)

    def predictions(self, model: str, since: float) -> Mapping[str, Sequence[float]]:
        return self.by_version


@dataclass
class FakePromoter:
    versions: FakeVersions
    promoted: list[str] = field(default_factory=list)
    rolled_back: list[str] = field(default_factory=list)
    previous: dict[str, str] = field(default_factory=dict)
    loaded: list[tuple[str, str]] = field(default_factory=list)

    def promote(self, model: str, version: str, *, production: str) -> Promotion:
        if self.versions.aliases["Production"] != production:
            raise Conflict(f"Production is not {production}")
        old = self.versions.aliases["Production"]
        self.previous[model] = old
        self.versions.aliases["Production"] = version
        self.promoted.append(model)
        return Promotion(model, old, self.versions.aliases["Production"], ("http://a", "http://b"))

    def load(self, model: str, alias: str, version: str) -> tuple[str, ...]:
        self.loaded.append((alias, version))
        return ("http://a", "http://b")

    def rollback(self, model: str, *, production: str) -> Promotion:
        if self.versions.aliases["Production"] != production:
            raise Conflict(f"Production is not {production}")
        old = self.versions.aliases["Production"]
        self.versions.aliases["Production"] = self.previous[model]
        self.rolled_back.append(model)
        return Promotion(model, old, self.previous[model], ("http://a", "http://b"))


@dataclass
class FakeFailures:
    resets: list[tuple[str, bool]] = field(default_factory=list)

    def reset(self, model: str, *, cooldown: bool) -> None:
        self.resets.append((model, cooldown))


@dataclass
class Audit:
    events: list[tuple[str, str, dict[str, Any]]] = field(default_factory=list)

    def __call__(self, type: str, subject: str, data: Mapping[str, Any]) -> None:
        self.events.append((type, subject, dict(data)))

    def types(self) -> list[str]:
        return [t for t, _s, _d in self.events]


@dataclass
class Loop:
    """Every fake, and the parts built over them."""

    clock: Clock
    store: FakeLoopStore
    versions: FakeVersions
    traffic: FakeTraffic
    calls: FakeCalls
    predictions: FakePredictions
    promoter: FakePromoter
    failures: FakeFailures
    audit: Audit
    parts: LoopParts
    drift_p: list[float]


def make_loop(**settings: Any) -> Loop:
    clock = Clock()
    versions = FakeVersions()
    drift_p = [0.5]
    loop = Loop(
        clock,
        FakeLoopStore(),
        versions,
        FakeTraffic(),
        FakeCalls(),
        FakePredictions(),
        FakePromoter(versions),
        FakeFailures(),
        Audit(),
        None,
        drift_p,
    )  # type: ignore[arg-type]  # parts is set below
    defaults: dict[str, Any] = {"min_requests": 20, "min_seconds": 10.0, "max_seconds": 60.0, "poll_s": 1.0}
    loop.parts = LoopParts(
        store=loop.store, versions=versions, traffic=loop.traffic, calls=loop.calls, predictions=loop.predictions,
        drift=lambda canary, production: (drift_p[0], 0.5), promoter=loop.promoter, failures=loop.failures,
        audit=loop.audit, settings=LoopSettings(**{**defaults, **settings}), clock=clock, sleep=clock.sleep,
    )  # fmt: skip
    return loop
