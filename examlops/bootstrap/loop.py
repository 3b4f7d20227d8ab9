"""The closed loop's adapters: ``closed_loop(settings)`` yields the ``LoopParts`` a canary analysis, a
rollback or `exa loop` acts through, and closes what it opened; ``model_versions(settings)`` the registry's
aliases alone, ``loop_store(settings)`` the loop records alone.

- the loop records in SQL (``loop.sql``), the traffic split in SQL with its ``traffic.changed`` audit event:
  more traffic to Canary only after its event (no event, no change: ``StoreUnavailable``), less traffic to
  Canary at once, its event after (``_Traffic.set``); serving applies it within its rules cache,
  ``traffic.rules_ttl_s``, plus a second;
- the window's calls from the trace store, its bus predictions from the snapshot stream, the drift test by
  Evidently (``monitoring.drift.prediction_drift``);
- promotion and rollback by ``promotion.service`` (what `exa promote` and `exa rollback` run: every
  serving instance reloads and confirms), each move an ``alias.move_intended`` audit event before it and
  ``alias.moved`` or ``alias.move_failed`` after;
- the failure windows in Redis; the audit hook of the control plane.

Nothing connects until used.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from examlops.bootstrap.control import AuditHook, ControlPlane, audit_moves
from examlops.bootstrap.sql import sql_engine
from examlops.core.settings import Settings
from examlops.loop.figures import CallSample
from examlops.loop.ports import LoopParts, Promotion, Versions
from examlops.loop.state import LoopStore

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine

    from examlops.monitoring.snapshots import SnapshotStream
    from examlops.serving.traffic_store import SqlTrafficRuleStore
    from examlops.tracing.sql_store import SqlTraceStore

SETTLE_MARGIN_S = 1.0
"""Added to the rules cache's TTL before a canary window opens."""


@dataclass
class _Versions:
    plane: ControlPlane

    def version(self, model: str, alias: str) -> str:
        return self.plane.registry.resolve(model, alias).version


@dataclass
class _Traffic:
    store: SqlTrafficRuleStore
    audit: AuditHook
    settle_s: float
    actor: str

    def get(self, model: str) -> dict[str, int]:
        return self.store.get(model)

    def set(self, model: str, weights: Mapping[str, int]) -> None:
        """A split that gives Canary more than it has is set as serving sets one (``ControlEvents.change_traffic``):
        its event first; no event, no change. One that gives Canary no more (a rejection, a split put back) is
        stored first and its event follows, ``StoreUnavailable`` after the store when that event is lost: taking
        traffic from an untested version never waits for the trail."""
        from examlops.monitoring.audit import TRAFFIC_CHANGED
        from examlops.serving.control_events import ControlEvents

        split = dict(weights)
        if split.get("Canary", 0) > self.store.get(model).get("Canary", 0):
            ControlEvents(self.audit).change_traffic(model, split, self.actor, lambda: self.store.set(model, split))
            return
        self.store.set(model, split)
        self.audit(TRAFFIC_CHANGED, model, {"weights": split, "actor": self.actor})


@dataclass
class _Calls:
    traces: SqlTraceStore

    def calls(self, model: str, since: float) -> list[CallSample]:
        return [CallSample(*row) for row in self.traces.outcomes(model, since)]


@dataclass
class _Predictions:
    stream: SnapshotStream

    def predictions(self, model: str, since: float) -> Mapping[str, Sequence[float]]:
        return self.stream.predictions_since(model, since)


@dataclass
class _Promoter:
    plane: ControlPlane
    actor: str

    def promote(self, model: str, version: str, *, production: str) -> Promotion:
        from examlops.promotion.service import promote

        self._expect(model, production)
        return self._done(promote(self.plane.settings, self.plane.registry, model, "Production",
                                  version=version, **self._follow()))  # fmt: skip

    def rollback(self, model: str, *, production: str) -> Promotion:
        from examlops.promotion.service import rollback

        self._expect(model, production)
        return self._done(rollback(self.plane.settings, self.plane.registry, model, "Production", **self._follow()))

    def _expect(self, model: str, production: str) -> None:
        from examlops.core.errors import Conflict

        now = self.plane.registry.resolve(model, "Production").version
        if now != production:
            raise Conflict(f"{model}: Production points at version {now}, not {production} as the loop expected; "
                           "someone else moved it, so the loop leaves it alone")  # fmt: skip

    def load(self, model: str, alias: str, version: str) -> tuple[str, ...]:
        from examlops.bootstrap.identity import platform_token
        from examlops.promotion.service import follow

        settings = self.plane.settings
        return follow(settings, model, alias, version, token=platform_token(settings)).instances

    def _follow(self) -> dict[str, Any]:
        from examlops.bootstrap.identity import platform_token

        trail = audit_moves(self.plane.audit, self.plane.redis, self.actor, by="closed loop")
        return {"trail": trail, "token": platform_token(self.plane.settings), "catalog": self.plane.catalog}

    @staticmethod
    def _done(result: Any) -> Promotion:
        return Promotion(result.model, result.old_version, result.new_version, tuple(result.instances))


@contextmanager
def closed_loop(
    settings: Settings, *, actor: str = "system:loop", say: Callable[[str], None] | None = None
) -> Iterator[LoopParts]:
    """The loop's parts on the settings' SQL, Redis, MLflow and serving instances; closed on exit.
    ``actor`` is named in the audit events of the traffic changes and alias moves it makes."""
    from examlops.adapters.redis import connect
    from examlops.loop.sql import SqlLoopStore
    from examlops.monitoring.drift import prediction_drift
    from examlops.monitoring.failure_store import RedisFailureStore
    from examlops.monitoring.snapshots import SnapshotStream
    from examlops.serving.traffic_store import SqlTrafficRuleStore
    from examlops.tracing.sql_store import SqlTraceStore

    plane = ControlPlane(settings)
    engine: Engine = sql_engine(settings)
    client = connect(settings.redis_url, socket_timeout_s=30.0)
    try:
        parts = LoopParts(
            store=SqlLoopStore(engine),
            versions=_Versions(plane),
            traffic=_Traffic(
                SqlTrafficRuleStore(engine), plane.audit, settings.traffic.rules_ttl_s + SETTLE_MARGIN_S, actor
            ),
            calls=_Calls(SqlTraceStore(engine)),
            predictions=_Predictions(SnapshotStream(client)),
            drift=prediction_drift,
            promoter=_Promoter(plane, actor),
            failures=RedisFailureStore(client),
            audit=plane.audit,
            settings=settings.loop,
        )
        if say is not None:
            parts.say = say
        yield parts
    finally:
        client.close()
        if "redis" in vars(plane):  # built only when a promotion ran
            plane.redis.close()
        engine.dispose()


def model_versions(settings: Settings) -> Versions:
    """What the aliases point at in the settings' MLflow registry, alone (`exa canary start` checks there is
    something to analyse before it starts a run); ``RegistryUnavailable`` when MLflow cannot be reached."""
    return _Versions(ControlPlane(settings))


@contextmanager
def loop_store(settings: Settings) -> Iterator[LoopStore]:
    """The loop records alone (`exa loop status`), on the settings' SQL; the engine is disposed on exit."""
    from examlops.loop.sql import SqlLoopStore

    engine = sql_engine(settings)
    try:
        yield SqlLoopStore(engine)
    finally:
        engine.dispose()


def refuse_if_held(settings: Settings, model: str) -> None:
    """``Conflict`` naming the run, when a live run holds ``model`` (one that showed a sign of life within
    ``loop.lease_s``): a run the CLI starts in Prefect would only be refused there, out of the operator's sight.
    A dead run's hold is no refusal: the next run ends it."""
    import time

    from examlops.core.errors import Conflict
    from examlops.loop.analysis import held_by

    with loop_store(settings) as store:
        record = store.get(model)
    if record is not None and record.held(time.time(), settings.loop.lease_s):
        raise Conflict(held_by(record, model))
