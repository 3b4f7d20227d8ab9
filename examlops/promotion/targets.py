"""What a promotion or rollback may name, checked before the registry is read or written.

``named(aliases, catalog, model, alias, from_alias=...)`` returns the model's catalog name and the aliases in
their canonical spelling, or raises:

- ``ModelNotFound`` with the catalog's message ("model 'NOPE' is not in the catalog (known: ...)"), as every
  other command gives it, when the model is not in ``catalog``: MLflow is not asked;
- ``InvalidInput`` naming the aliases allowed, when ``alias`` or ``from_alias`` is not one serving loads for the
  model (``core.messages.served_aliases``: ``settings.hotset.aliases`` and the model's default alias, in any
  case; the rule `exa task map` applies). No instance ever loads another alias, so a move to one could never be
  confirmed, and reading from one names a version nothing serves.

Without a ``catalog`` (tests, scripts) the model name goes to the registry as given and the aliases are checked
against ``aliases`` alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from examlops.core.messages import served_alias, served_aliases


class CatalogModel(Protocol):
    """What a promotion reads of one catalog entry (``registry.catalog.ModelSpec``)."""

    @property
    def name(self) -> str: ...

    @property
    def default_alias_canonical(self) -> str: ...


class ModelCatalog(Protocol):
    """The catalog (``registry.catalog.Catalog``): ``get`` matches any case, else raises ``ModelNotFound``."""

    def get(self, name: str) -> CatalogModel: ...


@dataclass(frozen=True, slots=True)
class Named:
    model: str
    alias: str
    from_alias: str | None = None


def named(
    aliases: Sequence[str], catalog: ModelCatalog | None, model: str, alias: str, from_alias: str | None = None
) -> Named:
    """The model and aliases a promotion names, checked (module docstring); nothing is read from the registry."""
    if catalog is None:
        served = served_aliases(aliases)
    else:
        spec = catalog.get(model)
        model, served = spec.name, served_aliases(aliases, spec.default_alias_canonical)
    chosen = served_alias(alias, served, model)
    source = None if from_alias is None else served_alias(from_alias, served, model, field="from_alias")
    return Named(model, chosen, source)
