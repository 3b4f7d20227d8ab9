"""The audit side of an alias move: what is written around it, and how a move the trail cannot account for is found.

``MoveTrail`` is the port a promotion writes through (``bootstrap.moves.AuditedMoves`` is its adapter over the
hash-chained audit trail):

- ``intended(move)`` before the registry is touched; when it raises, nothing moves (no alias moves without a
  trail);
- ``moved(move)`` after the registry moved the alias, ``failed(move, error)`` after it refused or could not be
  reached. The registry may have moved the alias although the call failed (a timeout after the server
  applied it): the failed event names the error and the version the alias was meant to leave, and the next
  check below tells the two apart;
- ``last(model, alias)`` what the trail last said about that alias (``AuditedMove``), None when it never said
  anything (an alias set before the trail existed, such as the demo seeding's).

``unaccounted(last, current)`` is the cheap check, one registry read and one lookup: the registry's version
of the alias against the last audited event. It names an intent with no outcome (the process died, or its
outcome could not be written), an alias whose version differs from the last audited move (moved outside
examlops, or by a failed call that did go through). It cannot see a move made and undone outside the trail
between two checks, nor aliases the trail never mentioned; verifying the chain itself is ``exa audit verify``.
``unaccounted_moves(moves, registry)`` runs it for every alias the trail spoke about (`exa audit verify`):
one registry read each; ``RegistryUnavailable`` propagates. ``check_aliases(moves, registry)`` is the same
check as every stored verify runs it (`exa audit verify`, the retention flow): a registry unreachable or
failing gives no findings and a note saying why (``AliasCheck.notes``), never a silent pass.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass
from typing import Literal, Protocol

from examlops.core.errors import AliasNotFound, ExamlopsError, ModelNotFound, VersionNotFound
from examlops.promotion.aliases import AliasMove, AliasRegistry

MoveState = Literal["intended", "moved", "failed"]


@dataclass(frozen=True, slots=True)
class AuditedMove:
    """The last alias event the trail holds for one alias."""

    state: MoveState
    model: str
    alias: str
    old_version: str | None
    new_version: str
    actor: str = ""
    error: str = ""


class MoveTrail(Protocol):
    def intended(self, move: AliasMove, unaccounted: str | None) -> None: ...

    def moved(self, move: AliasMove) -> None: ...

    def failed(self, move: AliasMove, error: BaseException) -> None: ...

    def last(self, model: str, alias: str) -> AuditedMove | None: ...


def unaccounted(last: AuditedMove | None, current: str | None) -> str | None:
    """What the trail cannot account for in ``current`` (the registry's version of the alias), or None."""
    if last is None:
        return None
    where = f"{last.model}@{last.alias}"
    now = f"the registry has {current or 'no such alias'}"
    was = last.old_version or "unset"
    if last.state == "intended":
        return (
            f"{where}: a move from {was} to {last.new_version}"
            f"{f' by {last.actor}' if last.actor else ''} has no recorded outcome; {now}"
        )
    if last.state == "moved" and current != last.new_version:
        return f"{where}: the last audited move put it at {last.new_version}, but {now}"
    if last.state == "failed" and current != last.old_version:
        if current == last.new_version:
            return f"{where}: a move to {last.new_version} recorded as failed ({last.error}) did happen"
        return f"{where}: after a failed move it should still be at {was}, but {now}"
    return None


def unaccounted_moves(moves: Iterable[AuditedMove], registry: AliasRegistry) -> list[str]:
    """``unaccounted`` for each alias in ``moves`` against the registry's version now; one line per finding."""
    found = []
    for last in moves:
        try:
            current: str | None = registry.resolve(last.model, last.alias).version
        except (AliasNotFound, ModelNotFound, VersionNotFound):
            current = None
        if (line := unaccounted(last, current)) is not None:
            found.append(line)
    return found


@dataclass(frozen=True, slots=True)
class AliasCheck:
    """What the trail cannot account for in the registry's aliases; ``unchecked``: why the registry was not
    read (None: it was, or the trail moved no alias)."""

    unaccounted: tuple[str, ...] = ()
    unchecked: str | None = None

    @property
    def notes(self) -> tuple[str, ...]:
        return (f"aliases not checked: {self.unchecked}",) if self.unchecked else ()


def check_aliases(moves: Collection[AuditedMove], registry: Callable[[], AliasRegistry]) -> AliasCheck:
    """``unaccounted_moves`` for ``moves`` against ``registry()`` (built only when the trail moved an alias); the
    registry unreachable or failing (any ``ExamlopsError``, building it or reading it) is an ``unchecked``
    result, so the chain's own result is still stored."""
    if not moves:
        return AliasCheck()
    try:
        return AliasCheck(tuple(unaccounted_moves(moves, registry())))
    except ExamlopsError as exc:
        return AliasCheck(unchecked=str(exc) or type(exc).__name__)
