"""Alias moves that remember what they replaced, so that a rollback can undo them.

This is the registry half of a promotion; ``examlops.promotion.service`` adds the serving half
(every instance reloads and confirms).

- ``move_alias(registry, model, alias, version=N | from_alias=A)`` points ``alias`` (any case) at
  version N, or at the version alias A points at now. It records the version the alias replaced in the
  registered-model tag ``examlops.previous.<Alias>`` (``previous_tag``): durable, so it survives
  restarts, and visible in the MLflow UI. A move to the version the alias already has changes nothing and
  leaves the tags alone. A new alias records nothing.
- ``rollback_alias(registry, model, alias)`` moves the alias to the version its last move replaced, itself
  with ``move_alias``: the rollback records the version it replaced, so a second rollback undoes the first.
- Each is a read (``plan_move``, ``plan_rollback``: what would move, from which version to which; nothing
  written) and a write (``apply_move``), so that a caller can record the intent in between.

The writes, in order: the previous tag settled to where a rollback goes now (``rollback_target``), when
it differs (the last move's alias write was applied but its reply lost, so the moving tag alone knew); the
tag ``examlops.moving.<Alias>`` (``moving_tag``) names the move ``old->new`` before the alias is touched;
then the alias; then the previous tag. No write overwrites what a rollback needs before the alias has
moved, and a failure at any step, after any earlier failed moves, leaves a rollback correct: the alias
write refused (the alias still at ``old``): the moving tag does not match the alias, so the rollback goes
to the previous tag, settled before; the alias write applied but its reply lost, or the previous tag not
written: the alias is at ``new`` and the moving tag says it came from ``old``, which is where the rollback
goes (``tests/unit/promotion/test_alias_failures.py`` tries every three steps).
Two promotions of one alias at the same time are not serialised here.

Errors: ``InvalidInput`` (neither or both of ``version`` and ``from_alias``), ``ModelNotFound``,
``AliasNotFound`` (``from_alias`` missing; for a rollback, the alias itself), ``VersionNotFound``
(no such version; for a rollback, nothing recorded to go back to), ``RegistryUnavailable`` (its subclass
``PreviousNotRecorded`` when only the last write failed: the alias moved).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from examlops.core.errors import (
    AliasNotFound,
    DependencyUnavailable,
    InvalidInput,
    RegistryUnavailable,
    VersionNotFound,
)
from examlops.core.messages import DEFAULT_ALIAS, ModelRef, canonical_alias

PREVIOUS_TAG_PREFIX = "examlops.previous."
MOVING_TAG_PREFIX = "examlops.moving."


ALIAS_MAY_HAVE_MOVED = "the alias may have moved; `exa audit verify` tells"
"""The note on an alias write that failed: the registry may have applied it and its answer been lost."""


class AliasRegistry(Protocol):
    """What a promotion needs of the registry (``MlflowRegistry``)."""

    def resolve(self, name: str, alias: str) -> ModelRef: ...

    def version(self, name: str, version: str) -> ModelRef: ...

    def set_alias(self, name: str, alias: str, version: str) -> ModelRef | None: ...

    def model_tags(self, name: str) -> dict[str, str]: ...

    def set_model_tag(self, name: str, key: str, value: str) -> None: ...


@dataclass(frozen=True, slots=True)
class AliasMove:
    """One alias move: ``old_version`` is None for an alias that did not exist."""

    model: str
    alias: str
    old_version: str | None
    new_version: str

    @property
    def changed(self) -> bool:
        return self.old_version != self.new_version


class PreviousNotRecorded(RegistryUnavailable):
    """The alias moved (``move``, as ``apply_move`` returns it) but the previous tag was not written. A rollback
    still goes back where it came from, by the moving tag; the move is done."""

    def __init__(self, move: AliasMove, error: BaseException) -> None:
        super().__init__(f"{move.model}@{move.alias} moved but the version it replaced was not recorded: {error}")
        self.move = move


def previous_tag(alias: str) -> str:
    """The registered-model tag that records what ``alias`` pointed at before its last move."""
    return PREVIOUS_TAG_PREFIX + canonical_alias(alias)


def moving_tag(alias: str) -> str:
    """The registered-model tag that names ``alias``'s last move begun (``old->new``), written before it moves."""
    return MOVING_TAG_PREFIX + canonical_alias(alias)


def rollback_target(tags: dict[str, str], alias: str, current: str) -> str | None:
    """The version a rollback of ``alias`` (now at ``current``) goes to, from the model's tags; None if none.

    The move begun last, when the alias is where it was meant to go (its outcome may never have been
    reported); otherwise the version the last completed move replaced."""
    begun_from, _, begun_to = tags.get(moving_tag(alias), "").partition("->")
    if begun_from and begun_to == current:
        return begun_from
    return tags.get(previous_tag(alias)) or None


def plan_move(
    registry: AliasRegistry,
    model: str,
    alias: str,
    *,
    version: str | int | None = None,
    from_alias: str | None = None,
) -> AliasMove:
    """The move ``move_alias`` would make, read from the registry; nothing is written."""
    if (version is None) == (from_alias is None):
        raise InvalidInput("give exactly one of a version and an alias to promote from", field="version")
    alias = canonical_alias(alias)
    if from_alias is not None:
        target = registry.resolve(model, from_alias)
    else:
        target = registry.version(model, str(version).strip())
    try:
        current: str | None = registry.resolve(target.name, alias).version
    except AliasNotFound:
        current = None
    return AliasMove(target.name, alias, current, target.version)


def apply_move(registry: AliasRegistry, move: AliasMove) -> AliasMove:
    """Make ``move`` in the registry: the previous tag settled, the moving tag, the alias, then the previous tag
    (module docstring).
    Returns the move as the registry reports it (``old_version`` is what the alias had at the moment it
    moved). The registry's errors propagate from whichever write failed: before the alias write nothing has
    moved; from the alias write itself with the note ``ALIAS_MAY_HAVE_MOVED``; from the previous tag's write
    as ``PreviousNotRecorded``, the alias moved."""
    replacing = move.old_version if move.changed else None
    if replacing is not None:
        _settle_previous(registry, move.model, move.alias, replacing)
        registry.set_model_tag(move.model, moving_tag(move.alias), f"{replacing}->{move.new_version}")
    try:
        replaced = registry.set_alias(move.model, move.alias, move.new_version)
    except DependencyUnavailable as exc:
        exc.add_note(ALIAS_MAY_HAVE_MOVED)
        raise
    moved = AliasMove(move.model, move.alias, replaced.version if replaced else None, move.new_version)
    if replacing is not None:
        try:
            registry.set_model_tag(move.model, previous_tag(move.alias), replacing)
        except DependencyUnavailable as exc:
            raise PreviousNotRecorded(moved, exc) from exc
    return moved


def _settle_previous(registry: AliasRegistry, model: str, alias: str, current: str) -> None:
    """Write to the previous tag where a rollback of ``alias`` (at ``current``) goes now, before the moving tag
    that tells it is overwritten: a move applied with its reply lost is then still undone after a later move
    that is refused."""
    tags = registry.model_tags(model)
    target = rollback_target(tags, alias, current)
    if target is not None and target != tags.get(previous_tag(alias)):
        registry.set_model_tag(model, previous_tag(alias), target)


def move_alias(
    registry: AliasRegistry,
    model: str,
    alias: str,
    *,
    version: str | int | None = None,
    from_alias: str | None = None,
) -> AliasMove:
    """Point ``alias`` at ``version`` (or at what ``from_alias`` points at); record the replaced version."""
    return apply_move(registry, plan_move(registry, model, alias, version=version, from_alias=from_alias))


def plan_rollback(registry: AliasRegistry, model: str, alias: str = DEFAULT_ALIAS) -> AliasMove:
    """The move back to the version the alias's last move replaced (``VersionNotFound`` if none is recorded)."""
    alias = canonical_alias(alias)
    current = registry.resolve(model, alias)
    recorded = rollback_target(registry.model_tags(current.name), alias, current.version)
    name = current.name
    if not recorded:
        raise VersionNotFound(
            f"{name}@{alias} has no recorded previous version to roll back to "
            f"(the tag {previous_tag(alias)} is written when the alias is promoted)"
        )
    return plan_move(registry, name, alias, version=recorded)


def rollback_alias(registry: AliasRegistry, model: str, alias: str = DEFAULT_ALIAS) -> AliasMove:
    """Move ``alias`` back to the version its last move replaced (``VersionNotFound`` if none is recorded)."""
    return apply_move(registry, plan_rollback(registry, model, alias))
