"""Promotion and rollback: move an alias in the registry with an audit trail, then make every serving instance follow.

``promote`` (what `exa promote`, the promote flow, the dashboard and the closed loop call) and ``rollback``
(``follow`` does step 5 alone):

0. check what the caller names (``promotion.targets``), before the registry is read: a model not in the
   ``catalog`` is ``ModelNotFound`` with the catalog's message; an alias (the one to move, or ``from_alias``)
   that serving does not load (``settings.hotset.aliases`` and the model's default alias) is ``InvalidInput``
   naming those it loads;
1. read what would move (``aliases.plan_move`` / ``plan_rollback``: the alias's version now and the target);
2. ``trail.intended(move, unaccounted)`` (``examlops.promotion.trail``): the intent goes on the trail before the
   registry is touched, with what the trail could not account for in the alias's current version. When it
   raises, the promotion stops there and nothing has moved;
3. move the alias (``aliases.apply_move``); on any failure ``trail.failed(move, error)`` and the error is
   raised: the registry's errors (``RegistryUnavailable`` within the MLflow timeouts of ``mlflow_client``;
   one from the alias write itself says that the alias may have moved, as its answer may be what was lost).
   A failure of the last write alone (``PreviousNotRecorded``: the alias moved, a rollback still goes back
   by the moving tag) is no failure: the move goes on as done, with a warning;
4. ``trail.moved(move)``. When the outcome cannot be written the alias has moved all the same: the promotion
   goes on and ``PromotionResult.warnings`` says so (the intent without an outcome is what `exa audit verify`
   and the next promotion of that alias then report);
5. ask every instance (``instances``; default ``settings.serving.instance_urls()``) to reload the
   model and wait until each reports the new version for the alias (``confirm_reload``).

A move to the version the alias already has moves nothing: step 3 is skipped (no registry write), steps 2
and 4 record the alias where it stands only when the trail cannot account for it, step 5 runs (lagging
instances catch up, or are reported), and the result says ``nothing_to_do``.

Without a ``trail`` (tests, scripts) steps 2 and 4 are skipped; without a ``catalog`` the model name goes to the
registry as given (every entry point passes one, so an unknown model gets the catalog's message). Returns a
``PromotionResult`` naming the confirmed instances. Raises ``PromotionIncomplete`` when any instance is lagging,
refused the version or cannot be reached: the message names each one and what it reported, and says that the
alias move stays done. Before the move: step 0's errors, the registry's read errors and the trail's (nothing
has changed then).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import httpx

from examlops.core.errors import ExamlopsError, PromotionIncomplete
from examlops.core.messages import DEFAULT_ALIAS, canonical_alias
from examlops.core.settings import Settings
from examlops.promotion.aliases import (
    AliasMove,
    AliasRegistry,
    PreviousNotRecorded,
    apply_move,
    moving_tag,
    plan_move,
    plan_rollback,
)
from examlops.promotion.instances import confirm_reload
from examlops.promotion.targets import ModelCatalog, named
from examlops.promotion.trail import MoveTrail, unaccounted

DEFAULT_TIMEOUT_S = 60.0
"""Seconds every instance gets to load the new version and report it."""


@dataclass(frozen=True, slots=True)
class PromotionResult:
    model: str
    alias: str
    old_version: str | None
    new_version: str
    instances: tuple[str, ...]
    """The serving instances that confirmed they serve ``new_version`` for the alias."""
    unaccounted: str | None = None
    """What the trail could not account for in the alias's version before this move (``trail.unaccounted``)."""
    warnings: tuple[str, ...] = ()
    """What went wrong without stopping the promotion (an outcome event or the previous tag not written)."""
    nothing_to_do: bool = False
    """The alias already pointed at ``new_version``: the registry was not written (the instances were asked)."""


def promote(
    settings: Settings,
    registry: AliasRegistry,
    model: str,
    alias: str,
    *,
    version: str | int | None = None,
    from_alias: str | None = None,
    catalog: ModelCatalog | None = None,
    instances: Sequence[str] | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    trail: MoveTrail | None = None,
    transport: httpx.BaseTransport | None = None,
    token: str | None = None,
) -> PromotionResult:
    """Point ``alias`` at ``version`` (or at what ``from_alias`` points at) and make every instance serve it."""
    name = named(settings.hotset.aliases, catalog, model, alias, from_alias)
    planned = plan_move(registry, name.model, name.alias, version=version, from_alias=name.from_alias)
    return _carry_out(settings, registry, planned, trail, instances, timeout_s, transport, token)


def rollback(
    settings: Settings,
    registry: AliasRegistry,
    model: str,
    alias: str = DEFAULT_ALIAS,
    *,
    catalog: ModelCatalog | None = None,
    instances: Sequence[str] | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    trail: MoveTrail | None = None,
    transport: httpx.BaseTransport | None = None,
    token: str | None = None,
) -> PromotionResult:
    """Move ``alias`` back to the version its last promotion replaced, and make every instance serve it."""
    name = named(settings.hotset.aliases, catalog, model, alias)
    planned = plan_rollback(registry, name.model, name.alias)
    return _carry_out(settings, registry, planned, trail, instances, timeout_s, transport, token)


def _carry_out(
    settings: Settings,
    registry: AliasRegistry,
    planned: AliasMove,
    trail: MoveTrail | None,
    instances: Sequence[str] | None,
    timeout_s: float,
    transport: httpx.BaseTransport | None,
    token: str | None,
) -> PromotionResult:
    """Steps 2 to 5 of the module docstring. A move that changes nothing writes nothing to the registry, but
    every instance is still asked to serve the version (running a promotion again is how lagging instances
    catch up, and they are reported as before), and the trail records the alias where it stands when the
    trail cannot account for it (so `exa audit verify` covers it from now on)."""
    if planned.changed:
        move, notes = _move(registry, planned, trail)
        return _follow(settings, move, notes, instances, timeout_s, transport, token)
    return replace(_follow(settings, planned, _in_place(planned, trail), instances, timeout_s, transport, token),
                   nothing_to_do=True)  # fmt: skip


def _in_place(planned: AliasMove, trail: MoveTrail | None) -> _Notes:
    """The trail's record of an alias that stays where it is, when the trail cannot account for it; nothing
    moves in the registry, so a trail that cannot be written is a warning, never a failure."""
    if trail is None:
        return _Notes()
    try:
        last = trail.last(planned.model, planned.alias)
        found = unaccounted(last, planned.old_version)
        if last is not None and found is None:
            return _Notes()
        trail.intended(planned, found)
        trail.moved(planned)
    except ExamlopsError as exc:
        return _Notes(None, (f"the alias did not move, and the audit trail could not record where it is: {exc}",))
    return _Notes(found)


@dataclass(frozen=True, slots=True)
class _Notes:
    unaccounted: str | None = None
    warnings: tuple[str, ...] = ()

    def lines(self) -> list[str]:
        before = [f"the audit trail did not account for this alias: {self.unaccounted}"] if self.unaccounted else []
        return before + list(self.warnings)


def _apply(registry: AliasRegistry, planned: AliasMove) -> tuple[AliasMove, tuple[str, ...]]:
    """Step 3: ``apply_move``, a previous tag not written being a warning (the alias moved)."""
    try:
        return apply_move(registry, planned), ()
    except PreviousNotRecorded as exc:
        where = f"a rollback still goes back to {planned.old_version}, by the tag {moving_tag(planned.alias)}"
        return exc.move, (f"{exc} ({where})",)


def _move(registry: AliasRegistry, planned: AliasMove, trail: MoveTrail | None) -> tuple[AliasMove, _Notes]:
    """Steps 2 to 4 of the module docstring."""
    if trail is None:
        move, warnings = _apply(registry, planned)
        return move, _Notes(None, warnings)
    found = unaccounted(trail.last(planned.model, planned.alias), planned.old_version)
    trail.intended(planned, found)
    try:
        move, warnings = _apply(registry, planned)
    except BaseException as exc:
        try:
            trail.failed(planned, exc)
        except ExamlopsError as lost:
            exc.add_note(f"its move_failed audit event was not written either: {lost}")
        raise
    try:
        trail.moved(move)
    except ExamlopsError as exc:
        warnings += (f"the alias moved but its audit outcome was not written: {exc}",)
    return move, _Notes(found, warnings)


def move_audited(
    registry: AliasRegistry, model: str, alias: str, *, version: str, trail: MoveTrail | None
) -> AliasMove:
    """Steps 1 to 4 without the instances: the alias moves in the registry with its intent and outcome on the
    trail (a retrain pointing a candidate alias, which no instance has to serve yet). Nothing is written when
    the alias already has ``version``. The caller checks the alias (``registry.retrain``: a candidate alias)."""
    planned = plan_move(registry, model, alias, version=version)
    return _move(registry, planned, trail)[0] if planned.changed else planned


def follow(
    settings: Settings,
    model: str,
    alias: str,
    version: str,
    *,
    instances: Sequence[str] | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    transport: httpx.BaseTransport | None = None,
    token: str | None = None,
) -> PromotionResult:
    """Make every instance serve ``version`` for ``alias``, where the registry already points: no alias moves
    (the closed loop loads a new Canary everywhere before it sends it traffic). ``PromotionIncomplete`` as
    for a promotion."""
    move = AliasMove(model, canonical_alias(alias), version, version)
    return _follow(settings, move, _Notes(), instances, timeout_s, transport, token)


def _follow(
    settings: Settings,
    move: AliasMove,
    notes: _Notes,
    instances: Sequence[str] | None,
    timeout_s: float,
    transport: httpx.BaseTransport | None,
    token: str | None,
) -> PromotionResult:
    urls = tuple(instances) if instances else settings.serving.instance_urls()
    reports = confirm_reload(
        urls,
        move.model,
        move.alias,
        move.new_version,
        timeout_s=timeout_s,
        connect_timeout_s=settings.http.connect_timeout_s,
        transport=transport,
        token=token,
    )
    confirmed = tuple(report.url for report in reports if report.confirmed)
    lagging = {report.url: report.detail for report in reports if not report.confirmed}
    if lagging:
        where = "; ".join(f"{url} {detail}" for url, detail in lagging.items())
        moved = (
            f"now points at version {move.new_version} in MLflow (was {move.old_version or 'unset'}; that move "
            f"stays done)"
            if move.changed
            else f"points at version {move.new_version} in MLflow (it did not move)"
        )
        raise PromotionIncomplete(
            f"{move.model}@{move.alias} {moved}, but {len(lagging)} of {len(reports)} "
            f"serving instance(s) do not serve it: {where}" + "".join(f"; {note}" for note in notes.lines()),
            confirmed=confirmed,
            lagging=lagging,
        )
    return PromotionResult(
        move.model, move.alias, move.old_version, move.new_version, confirmed, notes.unaccounted, notes.warnings
    )
