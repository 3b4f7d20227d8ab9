"""The audit trail of alias moves: ``AuditedMoves``, the ``promotion.trail.MoveTrail`` adapter, and its reader.

Each event goes on the hash-chained trail through the control plane's audit hook (signed at once), then
the per-alias index ``keys.AUDITED_ALIASES`` (a Redis hash: ``<model>/<Alias>`` -> the event as JSON) is
updated, so that the last word on one alias is one HGET. Events: ``alias.move_intended`` (model, alias,
from, to, actor, by, and ``unaccounted`` when the alias's version was not what the trail last said),
``alias.moved`` (the same fields and ``old_version``/``new_version`` as before), ``alias.move_failed``
(with ``error``). Every Redis or SQL failure is ``StoreUnavailable`` (or another ``ExamlopsError``): the
service decides what that means (an intent that cannot be written stops the promotion).

The index is written after the chain: when that write is lost, the index is one event behind the chain
and the checks report the older state, which errs towards reporting. The index is not signed: it only
speeds up ``last`` for a promotion's own check. `exa audit verify` does not read it: ``LastMoves``, fed every
event of the verified chain (``monitoring.audit.verify``'s ``seen``), gives the last word on each alias as the
signed chain holds it, so an index edited or emptied cannot hide an unaccounted move.

``verify_and_record(settings, audit, by)`` is that verify as `exa audit verify` and the retention flow both run
and store it: the chain, then ``promotion.trail.check_aliases`` against MLflow (``mlflow.timeout_s``), so a
later chain-only result never replaces one that found an alias move; then the catalog models' aliases no event
covers (``monitoring.audit.coverage``), stored as notes, not failures. MLflow unreachable or failing is a stored
note, and the previous result's alias findings are stored again (``carried_findings``): a run that could not
look never clears what one that could found. A local MLflow store that does not exist yet is not created by a
verify: it holds no alias.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from examlops.core import keys
from examlops.core.settings import Settings
from examlops.promotion.aliases import AliasMove
from examlops.promotion.trail import AuditedMove, MoveState

if TYPE_CHECKING:
    import redis

    from examlops.bootstrap.control import AuditAccess, AuditHook
    from examlops.monitoring.audit.chain import AuditEvent
    from examlops.monitoring.audit.coverage import AliasCoverage
    from examlops.monitoring.audit.verified import VerifyRecord
    from examlops.monitoring.audit.verify import VerifyReport
    from examlops.promotion.trail import AliasCheck
    from examlops.registry.mlflow_registry import MlflowRegistry


def _field(model: str, alias: str) -> str:
    return f"{model}/{alias}"


@dataclass
class AuditedMoves:
    """``MoveTrail`` over the audit hook and the index in ``client``; ``actor`` and ``by`` go into every event."""

    audit: AuditHook
    client: redis.Redis
    actor: str
    by: str

    def intended(self, move: AliasMove, unaccounted: str | None) -> None:
        from examlops.monitoring.audit import ALIAS_MOVE_INTENDED

        extra = {"unaccounted": unaccounted} if unaccounted else {}
        self._write(ALIAS_MOVE_INTENDED, "intended", move, extra)

    def moved(self, move: AliasMove) -> None:
        from examlops.monitoring.audit import ALIAS_MOVED

        self._write(ALIAS_MOVED, "moved", move, {})

    def failed(self, move: AliasMove, error: BaseException) -> None:
        from examlops.monitoring.audit import ALIAS_MOVE_FAILED

        self._write(ALIAS_MOVE_FAILED, "failed", move, {"error": f"{type(error).__name__}: {error}"[:500]})

    def last(self, model: str, alias: str) -> AuditedMove | None:
        from examlops.adapters.redis import translated

        with translated("the audited aliases"):
            raw = self.client.hget(keys.AUDITED_ALIASES, _field(model, alias))
        return _parse(str(raw)) if raw else None

    def _write(self, type: str, state: MoveState, move: AliasMove, extra: dict[str, Any]) -> None:
        from examlops.adapters.redis import translated

        data = {
            "model": move.model,
            "alias": move.alias,
            "old_version": move.old_version,
            "new_version": move.new_version,
            "from": move.old_version,
            "to": move.new_version,
            "by": self.by,
            "actor": self.actor,
            **extra,
        }
        self.audit(type, move.model, data)
        with translated("the audited aliases"):
            self.client.hset(keys.AUDITED_ALIASES, _field(move.model, move.alias), json.dumps({**data, "state": state}))


def _parse(raw: str) -> AuditedMove | None:
    try:
        data = json.loads(raw)
        return AuditedMove(
            state=data["state"],
            model=data["model"],
            alias=data["alias"],
            old_version=data.get("old_version"),
            new_version=str(data["new_version"]),
            actor=str(data.get("actor", "")),
            error=str(data.get("error", "")),
        )
    except (ValueError, KeyError, TypeError):
        return None  # an entry this release cannot read says nothing


@contextmanager
def audited_moves(settings: Settings, actor: str, by: str, audit: AuditHook | None = None) -> Iterator[AuditedMoves]:
    """``AuditedMoves`` on the settings' Redis, appending through ``audit`` (default: a ``control_events`` hook of
    its own on the settings' SQL); everything it opened is closed on exit. Nothing connects until used."""
    from examlops.adapters.redis import connect
    from examlops.bootstrap.control import control_events
    from examlops.bootstrap.sql import sql_engine

    client = connect(settings.redis_url)
    engine = None
    if audit is None:
        engine = sql_engine(settings)
        audit = control_events(settings, engine)
    try:
        yield AuditedMoves(audit, client, actor, by)
    finally:
        client.close()
        if engine is not None:
            engine.dispose()


class LastMoves:
    """The last alias event per alias among the audit events it is called with (``verify``'s ``seen``)."""

    def __init__(self) -> None:
        from examlops.monitoring.audit import ALIAS_MOVE_FAILED, ALIAS_MOVE_INTENDED, ALIAS_MOVED

        self._states: dict[str, MoveState] = {
            ALIAS_MOVE_INTENDED: "intended",
            ALIAS_MOVED: "moved",
            ALIAS_MOVE_FAILED: "failed",
        }
        self._last: dict[tuple[str, str], AuditedMove] = {}

    def __call__(self, event: AuditEvent) -> None:
        state = self._states.get(event.type)
        if state is None:
            return
        try:
            data = json.loads(event.data)
        except ValueError:
            return
        if not isinstance(data, dict):
            return
        move = _parse(json.dumps({**data, "state": state}))
        if move is not None:
            self._last[(move.model, move.alias)] = move

    def moves(self) -> list[AuditedMove]:
        return list(self._last.values())


@dataclass(frozen=True, slots=True)
class VerifyOutcome:
    """One verify: the chain's report, the moved aliases' check, the aliases no event covers, what was stored."""

    report: VerifyReport
    aliases: AliasCheck
    coverage: AliasCoverage
    record: VerifyRecord


def verify_and_record(settings: Settings, audit: AuditAccess, by: str) -> VerifyOutcome:
    """Verify the whole trail, every alias it moved and which catalog aliases it covers, store the result as
    ``by``'s. Redis or SQL down raises (``StoreUnavailable``); MLflow down does not (``AliasCheck.unchecked``)."""
    from examlops.monitoring.audit.coverage import AliasCoverage
    from examlops.monitoring.audit.verified import carried_findings, last_verify, record_verify
    from examlops.monitoring.audit.verify import verify
    from examlops.promotion.trail import check_aliases

    last_moves = LastMoves()
    report = verify(audit.store, audit.secret, audit.checkpoints, archive=audit.archive, seen=last_moves)
    registry = _registry_once(settings)
    aliases = check_aliases(last_moves.moves(), registry)
    findings = aliases.unaccounted
    if aliases.unchecked is not None:
        findings += carried_findings(last_verify(audit.store.redis, audit.secret))
        coverage = AliasCoverage()  # the registry cannot be read: aliases.notes already says so
    else:
        coverage = _coverage(settings, last_moves.moves(), registry)
    notes = aliases.notes + coverage.notes
    record = record_verify(audit.store.redis, audit.secret, report, by, findings=findings, notes=notes)
    return VerifyOutcome(report, aliases, coverage, record)


def _registry_once(settings: Settings) -> Callable[[], MlflowRegistry]:
    """The settings' registry, built on the first call only: the two alias checks share its client."""
    from functools import cache

    from examlops.bootstrap.serving import model_registry

    return cache(lambda: model_registry(settings))


def _coverage(settings: Settings, moves: list[AuditedMove], registry: Callable[[], MlflowRegistry]) -> AliasCoverage:
    """``uncovered_aliases`` for the catalog's models; none in a local store not created yet (reading it would
    create it); a catalog that cannot be loaded is ``unchecked``, as the registry's errors are."""
    from examlops.bootstrap.serving import catalog
    from examlops.core.errors import ExamlopsError
    from examlops.monitoring.audit.coverage import AliasCoverage, uncovered_aliases

    uri = settings.mlflow_tracking_uri
    if uri.startswith("sqlite:///") and not Path(uri.removeprefix("sqlite:///")).exists():
        return AliasCoverage()
    try:
        models = [spec.name for spec in catalog(settings)]
    except ExamlopsError as exc:
        return AliasCoverage(unchecked=f"the catalog cannot be loaded: {exc}")

    def aliases_of(model: str) -> dict[str, str]:
        return {alias: ref.version for alias, ref in registry().aliases(model).items()}

    return uncovered_aliases(moves, models, aliases_of)
