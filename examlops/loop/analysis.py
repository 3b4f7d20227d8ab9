"""The canary analysis: send a share of the default alias's traffic to Canary, watch both versions over a
window, judge the gates, then promote, reject or leave things as they were.

``CanaryAnalysis(parts).run(model, owner=...)``:

1. ends a dead run's hold first (``recovery.end_dead_run``: its split goes back), then holds the model
   in the ``canary`` phase (``LoopStore.claim``; a run that already holds it, such as the retrain run
   that made the candidate, keeps it). ``Conflict`` when another live run holds it. Before any of that,
   ``versions_to_analyse``: ``InvalidInput`` when there is nothing to analyse (Canary points nowhere, or
   at Production's version), so that nothing is held or recorded;
2. has every serving instance load Canary's version and confirm it (a retrain moved the alias in the
   registry only), then stores the split ``Production: 100 - share, Canary: share``
   (``loop.canary_started``); the window opens once every instance applies it (the traffic port's
   ``settle_s`` after the split was stored);
3. every ``poll_s``: reads the traced calls and bus predictions of the window, judges the gates
   (``gates.judge``), stores the figures so far (``exa loop status`` shows them) and renews the hold;
   stops on a decision, at ``max_seconds`` (undecided), or when an abort was asked for;
4. acts and records (``actions.settle``): pass promotes the version analysed, fail sets Canary's share to 0,
   undecided and aborted put the split back; one ``loop.decided`` event each.

An error on the way puts the split back where it can and ends the hold with ``loop.decided`` ``error``
(``actions.give_up``), then propagates. A run that lost its hold (another took the model after its lease
ran out) stops without acting: ``Conflict``.
"""

from __future__ import annotations

import time

from examlops.core.errors import AliasNotFound, Conflict, InvalidInput
from examlops.loop import events
from examlops.loop.actions import Run, give_up, settle
from examlops.loop.figures import figures_of
from examlops.loop.gates import DriftFigure, judge, verdict
from examlops.loop.ports import LoopParts, Versions
from examlops.loop.recovery import end_dead_run
from examlops.loop.state import LoopRecord, Phase
from examlops.loop.window import AnalysisResult, Window


def versions_to_analyse(versions: Versions, model: str) -> tuple[str, str]:
    """``(Canary's version, Production's)`` of ``model``: what an analysis would compare. ``InvalidInput`` when
    there is nothing to analyse: Canary points nowhere, or at Production's version (checked before a run is
    started or holds the model, so the refusal is no loop outcome). ``AliasNotFound`` when Production points
    nowhere; the registry's errors otherwise."""
    try:
        canary = versions.version(model, "Canary")
    except AliasNotFound as exc:
        raise InvalidInput(f"{model}: Canary is not set: nothing to analyse (`exa retrain {model}` puts a "
                           "better candidate there)", field="model") from exc  # fmt: skip
    production = versions.version(model, "Production")
    if canary == production:
        raise InvalidInput(f"{model}: Canary and Production are both version {canary}: nothing to analyse",
                           field="model")  # fmt: skip
    return canary, production


class CanaryAnalysis:
    def __init__(self, parts: LoopParts) -> None:
        self.parts = parts

    def run(self, model: str, *, owner: str, run: str = "", share: int | None = None) -> AnalysisResult:
        """Analyse ``model``'s Canary against its Production and act on the decision (module docstring)."""
        p, settings = self.parts, self.parts.settings
        share = settings.canary_share if share is None else share
        if not 1 <= share <= 50:
            raise InvalidInput("Canary's share must be between 1 and 50 percent", field="share")
        canary_version, production_version = versions_to_analyse(p.versions, model)
        end_dead_run(p, model)  # a dead run's split is not the site's own
        started = p.clock()
        restore = p.traffic.get(model)
        held = p.store.claim(
            model, owner, Phase.CANARY, started, settings.lease_s, run=run, started_at=started,
            canary_version=canary_version, production_version=production_version, share=share,
            restore=restore, figures={}, note=f"loading Canary v{canary_version} on every instance",
        )  # fmt: skip
        if held is None:
            raise Conflict(held_by(p.store.get(model), model))
        split = {"Production": 100 - share, "Canary": share}
        this = Run(model, owner, restore, share, started, started + p.traffic.settle_s)
        try:
            loaded = p.promoter.load(model, "Canary", canary_version)
            p.say(f"{model}: Canary v{canary_version} loaded on {len(loaded)} instance(s)")
            p.traffic.set(model, split)
            this = Run(model, owner, restore, share, started, p.clock() + p.traffic.settle_s)
            p.audit(events.CANARY_STARTED, model, {
                "production_version": production_version, "canary_version": canary_version, "share": share,
                "split": split, "restored_after": restore, "run": run, "limits": settings.model_dump(),
            })  # fmt: skip
            p.say(f"{model}: {share} % of the traffic to Canary (v{canary_version}) against Production "
                  f"(v{production_version}); the window opens in {p.traffic.settle_s:g} s")  # fmt: skip
            how, window = self._watch(this, canary_version, production_version)
            return settle(p, this, how, window)
        except BaseException as exc:
            give_up(p, this, exc)
            raise

    def _watch(self, run: Run, canary: str, production: str) -> tuple[str, Window]:
        """Poll until a decision, the time limit or an abort: ("decided" | "limit" | "aborted", last window)."""
        p, settings = self.parts, self.parts.settings
        window = self._judge(run.model, canary, production, run.window_start, run.window_start)
        while True:
            now = p.clock()
            if now >= run.window_start:
                window = self._judge(run.model, canary, production, run.window_start, now)
            elapsed = max(0.0, now - run.window_start)
            record = p.store.update(run.model, run.owner, now, figures=window.figures(elapsed),
                                    note=_progress(window, elapsed))  # fmt: skip
            if record is None:
                raise Conflict(f"{run.model}: this analysis no longer holds the model (its lease ran out); it stops")
            if record.abort_requested:
                return "aborted", window
            if now >= run.window_start and window.decision != "undecided":
                return "decided", window
            if elapsed >= settings.max_seconds:
                return "limit", window
            p.sleep(settings.poll_s if now >= run.window_start else min(settings.poll_s, run.window_start - now))

    def _judge(self, model: str, canary: str, production: str, since: float, now: float) -> Window:
        p = self.parts
        calls = p.calls.calls(model, since)
        figures = figures_of(calls, production), figures_of(calls, canary)
        predictions = p.predictions.predictions(model, since)
        ours, theirs = list(predictions.get(canary, ())), list(predictions.get(production, ()))
        p_value = distance = None
        if min(len(ours), len(theirs)) >= p.settings.drift_min_rows:
            p_value, distance = p.drift(ours, theirs)
        drift = DriftFigure(p_value, len(ours), len(theirs), distance)
        gates = judge(figures[0], figures[1], drift, p.settings)
        decision = verdict(gates, figures[1], max(0.0, now - since), p.settings)
        return Window(figures[0], figures[1], drift, gates, decision)


def _progress(window: Window, elapsed: float) -> str:
    canary, production = window.canary, window.production
    return (
        f"{elapsed:.0f} s: Canary {canary.requests} calls, failure rate {canary.failure_rate:.3f}; "
        f"Production {production.requests} calls, failure rate {production.failure_rate:.3f}"
    )


def held_by(record: LoopRecord | None, model: str) -> str:
    if record is None:
        return f"{model}: another run holds the model"
    since = time.strftime("%H:%M:%S", time.gmtime(record.started_at))
    return f"{model}: a loop is running ({record.phase.value} since {since} UTC, run {record.run or record.owner})"
