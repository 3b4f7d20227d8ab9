"""Promotion and rollback: move an alias in the registry, then make every serving instance follow.

``promote`` (what `exa promote` and the promote flow call) and ``rollback`` (``follow`` does step 3 alone):

1. move the alias in MLflow, recording the version it replaced (``examlops.promotion.aliases``);
2. call ``on_moved(move)`` if given: the hook for the audit trail (an exception from it propagates:
   the alias has moved and the instances were not asked);
3. ask every instance (``instances``; default ``settings.serving.instance_urls()``) to reload the
   model and wait until each reports the new version for the alias (``confirm_reload``).

Returns a ``PromotionResult`` naming the confirmed instances. Raises ``PromotionIncomplete`` when
any instance is lagging, refused the version or cannot be reached: the message names each one and
what it reported, and says that the alias move stays done. Before the move: the registry errors of
``move_alias`` / ``rollback_alias`` (nothing has changed then).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import httpx

from examlops.core.errors import PromotionIncomplete
from examlops.core.messages import DEFAULT_ALIAS, canonical_alias
from examlops.core.settings import Settings
from examlops.promotion.aliases import AliasMove, AliasRegistry, move_alias, rollback_alias
from examlops.promotion.instances import confirm_reload

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


def promote(
    settings: Settings,
    registry: AliasRegistry,
    model: str,
    alias: str,
    *,
    version: str | int | None = None,
    from_alias: str | None = None,
    instances: Sequence[str] | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    on_moved: Callable[[AliasMove], None] | None = None,
    transport: httpx.BaseTransport | None = None,
    token: str | None = None,
) -> PromotionResult:
    """Point ``alias`` at ``version`` (or at what ``from_alias`` points at) and make every instance serve it."""
    move = move_alias(registry, model, alias, version=version, from_alias=from_alias)
    return _follow(settings, move, instances, timeout_s, on_moved, transport, token)


def rollback(
    settings: Settings,
    registry: AliasRegistry,
    model: str,
    alias: str = DEFAULT_ALIAS,
    *,
    instances: Sequence[str] | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    on_moved: Callable[[AliasMove], None] | None = None,
    transport: httpx.BaseTransport | None = None,
    token: str | None = None,
) -> PromotionResult:
    """Move ``alias`` back to the version its last promotion replaced, and make every instance serve it."""
    move = rollback_alias(registry, model, alias)
    return _follow(settings, move, instances, timeout_s, on_moved, transport, token)


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
    return _follow(settings, move, instances, timeout_s, None, transport, token)


def _follow(
    settings: Settings,
    move: AliasMove,
    instances: Sequence[str] | None,
    timeout_s: float,
    on_moved: Callable[[AliasMove], None] | None,
    transport: httpx.BaseTransport | None,
    token: str | None,
) -> PromotionResult:
    if on_moved is not None:
        on_moved(move)
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
        raise PromotionIncomplete(
            f"{move.model}@{move.alias} now points at version {move.new_version} in MLflow "
            f"(was {move.old_version or 'unset'}; that move stays done), but {len(lagging)} of {len(reports)} "
            f"serving instance(s) do not serve it: {where}",
            confirmed=confirmed,
            lagging=lagging,
        )
    return PromotionResult(move.model, move.alias, move.old_version, move.new_version, confirmed)
