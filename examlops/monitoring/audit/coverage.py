"""Which aliases the audit trail says nothing about: what `exa audit verify`'s alias check cannot judge.

The alias check (``promotion.trail.check_aliases``) compares an alias's version in the registry with the last
alias event the verified chain holds for it. An alias no event names (set in a registry before examlops used
it, by a demo seed older than the audited one, or only ever outside examlops) has nothing to be compared with,
so a move of it cannot be seen. ``uncovered_aliases(moves, models, aliases_of)`` names every such alias of
``models`` with its version now, so that verify lists it as not covered by the trail instead of passing it in
silence. Not a failure: nothing says the alias is wrong, only that the trail cannot tell.

``aliases_of(model)`` is the port: the model's aliases now, alias -> version (``MlflowRegistry.aliases``).
A model it does not know (``ModelNotFound``) has none. Any other ``ExamlopsError`` (the registry unreachable
or failing) stops the listing at once and is the result's ``unchecked``: one timeout, not one per model.
Models and aliases are matched case-insensitively (``canonical_alias``), as the registry matches them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from examlops.core.errors import ExamlopsError, ModelNotFound
from examlops.core.messages import canonical_alias
from examlops.promotion.trail import AuditedMove

NOT_COVERED = "not covered by the trail"
"""How verify names an alias no event covers (its stored note starts with it: ``AliasCoverage.notes``)."""


@dataclass(frozen=True, slots=True)
class UncoveredAlias:
    model: str
    alias: str
    version: str

    def __str__(self) -> str:
        return f"{self.model}@{self.alias} -> {self.version}"


@dataclass(frozen=True, slots=True)
class AliasCoverage:
    """The aliases no alias event covers, in model then alias order; ``unchecked``: why they could not all be
    listed (None: they were)."""

    uncovered: tuple[UncoveredAlias, ...] = ()
    unchecked: str | None = None

    @property
    def notes(self) -> tuple[str, ...]:
        """One line per uncovered alias, then why the listing stopped: what a stored verify result carries."""
        lines = tuple(f"{NOT_COVERED}: {alias}" for alias in self.uncovered)
        return lines + ((f"aliases {NOT_COVERED} not listed: {self.unchecked}",) if self.unchecked else ())


def uncovered_aliases(
    moves: Iterable[AuditedMove], models: Iterable[str], aliases_of: Callable[[str], Mapping[str, str]]
) -> AliasCoverage:
    """The aliases of ``models`` that no move in ``moves`` (the last event per alias of the verified chain)
    names; the registry's errors as ``unchecked`` (module docstring)."""
    covered = {(move.model.lower(), canonical_alias(move.alias)) for move in moves}
    found: list[UncoveredAlias] = []
    for model in models:
        try:
            aliases = aliases_of(model)
        except ModelNotFound:
            continue
        except ExamlopsError as exc:
            return AliasCoverage(tuple(found), unchecked=str(exc) or type(exc).__name__)
        for alias, version in sorted(aliases.items()):
            if (model.lower(), canonical_alias(alias)) not in covered:
                found.append(UncoveredAlias(model, canonical_alias(alias), version))
    return AliasCoverage(tuple(found))
