"""The canary analysis: send a share of the default alias's traffic to Canary, watch both versions over a
window, judge the gates, then promote, reject or leave things as they were.

``CanaryAnalysis(parts).run(model, owner=...)``:

1. ends a dead run's hold first (``recovery.end_dead_run``: its split goes back), then holds the model
   in the ``canary`` phase (``LoopStore.claim``; a run that already holds it, such as the retrain run
   that made the candidate, keeps it). ``Conflict`` when another live run holds it;
   ``InvalidInput`` when Canary and Production are the same version;
2. has every serving instance load Canary's version and confirm it (a retrain moved the alias in the
   registry only), then stores the split ``Production: 100 - share, Canary: share``
   (``loop.canary_started``) and waits until every instance applies it (the traffic port's ``settle_s``);
   the window starts then;
3. every ``poll_s``: reads the traced calls and bus predictions of the window, judges the gates
   (``gates.judge``), stores the figures so far (``exa loop status`` shows them) and renews the hold;
   stops on a decision, at ``max_seconds`` (undecided), or when an abort was asked for;
4. acts: **pass** promotes Canary to Production on every instance (the promoter: the service `exa promote`
   runs), puts the split back as it was, and empties the model's failure window and retrain cooldown so
   that a failing new Production trips the trigger at once (``trigger.py`` then rolls it back within the
   grace period); **fail** sets Canary's share to 0 and leaves Production as it was; **undecided** and
   **aborted** put the split back and change nothing else;
5. appends ``loop.decided`` naming every gate, its figures and limit, and ends the hold.

An error on the way (a store down, an instance that cannot load Canary) puts the split back where it can,
ends the hold as ``undecided`` with the error as its note, and propagates; a promotion an instance did not
follow stays recorded as ``promoted`` (the alias moved) with the lagging instances in its note. A run
that lost its hold (another took the model after its lease ran out) stops without acting: ``Conflict``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from examlops.core.errors import Conflict, InvalidInput, PromotionIncomplete
from examlops.core.settings import LoopSettings
from examlops.loop import events
from examlops.loop.figures import VersionFigures, figures_of
from examlops.loop.gates import Decision, DriftFigure, GateResult, judge, verdict
from examlops.loop.ports import (
    CallSource,
    DriftTest,
    FailureWindows,
    PredictionSource,
    Promoter,
    Promotion,
    TrafficSplit,
    Versions,
)
from examlops.loop.recovery import end_dead_run
from examlops.loop.state import LoopRecord, LoopStore, Phase

AuditHook = Callable[[str, str, Mapping[str, Any]], None]


@dataclass
class LoopParts:
    """What the loop acts through (``bootstrap.loop`` builds them), its settings, and its clock."""

    store: LoopStore
    versions: Versions
    traffic: TrafficSplit
    calls: CallSource
    predictions: PredictionSource
    drift: DriftTest
    promoter: Promoter
    failures: FailureWindows
    audit: AuditHook
    settings: LoopSettings
    clock: Callable[[], float] = time.time
    sleep: Callable[[float], None] = time.sleep
    say: Callable[[str], None] = field(default=lambda _message: None)


@dataclass(frozen=True, slots=True)
class AnalysisResult:
    model: str
    decision: Decision | str
    """pass, fail, undecided or aborted."""
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
            "drift": {"p_value": self.drift.p_value, "canary_rows": self.drift.canary_rows,
                      "production_rows": self.drift.production_rows},
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


@dataclass
class _Window:
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
            "drift": {"p_value": self.drift.p_value, "canary_rows": self.drift.canary_rows,
                      "production_rows": self.drift.production_rows},
            "gates": [gate.to_json() for gate in self.gates],
            "decision": self.decision,
        }  # fmt: skip


class CanaryAnalysis:
    def __init__(self, parts: LoopParts) -> None:
        self.parts = parts

    def run(self, model: str, *, owner: str, run: str = "", share: int | None = None) -> AnalysisResult:
        """Analyse ``model``'s Canary against its Production and act on the decision (module docstring)."""
        p, settings = self.parts, self.parts.settings
        share = settings.canary_share if share is None else share
        if not 1 <= share <= 50:
            raise InvalidInput("Canary's share must be between 1 and 50 percent", field="share")
        canary_version = p.versions.version(model, "Canary")
        production_version = p.versions.version(model, "Production")
        if canary_version == production_version:
            raise InvalidInput(f"{model}: Canary and Production are both version {canary_version}: nothing to analyse")
        end_dead_run(p, model)  # a dead run's split is not the site's own
        started = p.clock()
        restore = p.traffic.get(model)
        held = p.store.claim(
            model, owner, Phase.CANARY, started, settings.lease_s, run=run, started_at=started,
            canary_version=canary_version, production_version=production_version, share=share,
            restore=restore, figures={}, note=f"setting Canary's share to {share} %",
        )  # fmt: skip
        if held is None:
            raise Conflict(_held_by(p.store.get(model), model))
        split = {"Production": 100 - share, "Canary": share}
        try:
            loaded = p.promoter.load(model, "Canary", canary_version)
            p.say(f"{model}: Canary v{canary_version} loaded on {len(loaded)} instance(s)")
            p.traffic.set(model, split)
            p.audit(events.CANARY_STARTED, model, {
                "production_version": production_version, "canary_version": canary_version, "share": share,
                "split": split, "restored_after": restore, "run": run, "limits": settings.model_dump(),
            })  # fmt: skip
            p.say(f"{model}: {share} % of the traffic to Canary (v{canary_version}) against Production "
                  f"(v{production_version}); the window opens in {p.traffic.settle_s:g} s")  # fmt: skip
            window_start = started + p.traffic.settle_s
            outcome = self._watch(model, owner, canary_version, production_version, window_start)
            return self._act(model, owner, outcome, restore, share, started, window_start)
        except BaseException as exc:
            self._give_up(model, owner, restore, exc)
            raise

    def _watch(self, model: str, owner: str, canary: str, production: str, window_start: float) -> tuple[str, _Window]:
        """Poll until a decision, the time limit or an abort: ("decided" | "limit" | "aborted", last window)."""
        p, settings = self.parts, self.parts.settings
        window = self._judge(model, canary, production, window_start, p.clock())
        while True:
            now = p.clock()
            if now >= window_start:
                window = self._judge(model, canary, production, window_start, now)
            elapsed = max(0.0, now - window_start)
            record = p.store.update(model, owner, now, figures=window.figures(elapsed), note=_progress(window, elapsed))
            if record is None:
                raise Conflict(f"{model}: this analysis no longer holds the model (its lease ran out); it stops")
            if record.abort_requested:
                return "aborted", window
            if now >= window_start and window.decision != "undecided":
                return "decided", window
            if elapsed >= settings.max_seconds:
                return "limit", window
            p.sleep(min(settings.poll_s, max(0.05, window_start - now) if now < window_start else settings.poll_s))

    def _judge(self, model: str, canary: str, production: str, since: float, now: float) -> _Window:
        p = self.parts
        calls = p.calls.calls(model, since)
        figures = figures_of(calls, production), figures_of(calls, canary)
        predictions = p.predictions.predictions(model, since)
        ours, theirs = list(predictions.get(canary, ())), list(predictions.get(production, ()))
        p_value = None
        if min(len(ours), len(theirs)) >= p.settings.drift_min_rows:
            p_value = p.drift(ours, theirs)
        drift = DriftFigure(p_value, len(ours), len(theirs))
        gates = judge(figures[0], figures[1], drift, p.settings)
        decision = verdict(gates, figures[1], max(0.0, now - since), p.settings)
        return _Window(figures[0], figures[1], drift, gates, decision)

    def _act(
        self, model: str, owner: str, outcome: tuple[str, _Window], restore: dict[str, int], share: int,
        started: float, window_start: float,
    ) -> AnalysisResult:  # fmt: skip
        p = self.parts
        how, window = outcome
        decision: str = {"aborted": "aborted", "limit": "undecided"}.get(how, window.decision)
        promotion = None
        if decision == "pass":
            p.say(f"{model}: Canary passed every gate; promoting version {window.canary.version}")
            try:
                promotion = p.promoter.promote(model)
            except PromotionIncomplete as exc:  # the alias moved: that stands, and the record says so
                self._record_incomplete(model, owner, window, exc)
                raise
            p.traffic.set(model, restore)
            p.failures.reset(model, cooldown=True)
            phase, done = (
                Phase.PROMOTED,
                (
                    f"promoted version {promotion.new_version} to Production (was {promotion.old_version}) on "
                    f"{len(promotion.instances)} instance(s); split restored"
                ),
            )
        elif decision == "fail":
            p.traffic.set(model, _without_canary(restore))
            phase, done = Phase.REJECTED, "Canary's share set to 0; Production unchanged"
        else:
            p.traffic.set(model, restore)
            phase = Phase.ABORTED if decision == "aborted" else Phase.UNDECIDED
            done = "split restored; nothing else changed" + (
                "" if decision == "aborted" else
                f" (Canary had {window.canary.requests} of {p.settings.min_requests} calls at the time limit)"
            )  # fmt: skip
        now = p.clock()
        result = AnalysisResult(
            model, decision, phase, window.production, window.canary, window.drift, window.gates, share, started,
            window_start, now, promotion, done,
        )  # fmt: skip
        failed = [gate.gate for gate in window.gates if gate.passed is False]
        p.audit(events.DECIDED, model, {**result.to_json(), "failed_gates": failed})
        values: dict[str, Any] = {"figures": window.figures(max(0.0, now - window_start)), "note": done, "share": 0}
        if promotion is not None:
            values |= {"promoted_at": now, "replaced_version": promotion.old_version}
        p.store.finish(model, owner, phase, now, **values)
        p.say(f"{model}: {decision}: {done}")
        return result

    def _record_incomplete(self, model: str, owner: str, window: _Window, error: PromotionIncomplete) -> None:
        p, now = self.parts, self.parts.clock()
        note = f"promoted, but not every instance followed: {error}"[:500]
        p.audit(events.DECIDED, model, {"decision": "pass", "phase": Phase.PROMOTED.value, "note": note,
                                        "gates": [gate.to_json() for gate in window.gates]})  # fmt: skip
        p.store.finish(model, owner, Phase.PROMOTED, now, note=note, promoted_at=now, share=0,
                       replaced_version=window.production.version)  # fmt: skip

    def _give_up(self, model: str, owner: str, restore: dict[str, int], error: BaseException) -> None:
        """After an error: put the split back and end the hold as undecided, as far as the stores allow."""
        p = self.parts
        if isinstance(error, Conflict):
            return  # the hold is another run's now: so is the split
        try:
            p.traffic.set(model, restore)
        except Exception as exc:
            p.say(f"{model}: could not put the split back ({exc}); set it with `exa serve traffic`")
        try:  # a no-op when the hold already ended (a promotion an instance did not follow is recorded as such)
            p.store.finish(model, owner, Phase.UNDECIDED, p.clock(), note=f"stopped by an error: {error}"[:500])
        except Exception as exc:
            p.say(f"{model}: could not record how the analysis ended: {exc}")


def _without_canary(split: Mapping[str, int]) -> dict[str, int]:
    """``split`` with Canary's weight given to Production (empty stays empty: all to the default alias)."""
    kept = {alias: weight for alias, weight in split.items() if alias.lower() != "canary"}
    moved = sum(weight for alias, weight in split.items() if alias.lower() == "canary")
    if moved and kept:
        kept["Production"] = kept.get("Production", 0) + moved
    return kept


def _progress(window: _Window, elapsed: float) -> str:
    canary, production = window.canary, window.production
    return (
        f"{elapsed:.0f} s: Canary {canary.requests} calls, failure rate {canary.failure_rate:.3f}; "
        f"Production {production.requests} calls, failure rate {production.failure_rate:.3f}"
    )


def _held_by(record: LoopRecord | None, model: str) -> str:
    if record is None:
        return f"{model}: another run holds the model"
    since = time.strftime("%H:%M:%S", time.gmtime(record.started_at))
    return f"{model}: a loop is running ({record.phase.value} since {since} UTC, run {record.run or record.owner})"
