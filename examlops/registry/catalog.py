"""The model catalog: one YAML per model, validated as a whole when loaded.

A catalog entry names the model, its bus address (``seanerbus_uuid``), its
default alias, its input schema and the tasks it serves. Loading refuses the
whole catalog on the first problem, with a message that names the file and
the field: a bad UUID, a duplicate name or UUID, an unknown field type.
An embedding without a ``length`` takes the catalog's default, ``EXAMLOPS_EMBEDDING_DIM``
(``settings.embedding_dim``, 384 unless set). Names match case-insensitively everywhere
(``jpcp`` is ``JPCP``).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, model_validator

from examlops.core.budget import MAX_BUDGET_MS
from examlops.core.errors import CatalogError, ModelNotFound
from examlops.core.messages import DEFAULT_ALIAS, TASK_NAME_MAX, TASK_NAME_PATTERN, canonical_alias
from examlops.core.settings import DEFAULT_EMBEDDING_DIM


class _Bounded(BaseModel):
    """A numeric field's inclusive bounds; either may be absent, and ``minimum`` may not exceed ``maximum``."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    minimum: float | None = None
    maximum: float | None = None

    @model_validator(mode="after")
    def _ordered(self) -> _Bounded:
        if self.minimum is not None and self.maximum is not None and self.minimum > self.maximum:
            raise ValueError(f"minimum {self.minimum} is above maximum {self.maximum}")
        return self


class FloatArrayField(_Bounded):
    """An embedding: ``length`` finite numbers, each within ``minimum``/``maximum`` when given."""

    type: Literal["float_array"]
    length: int = Field(ge=1)


class IntegerField(_Bounded):
    type: Literal["integer"]
    minimum: int | None = None  # narrows the float bound to int
    maximum: int | None = None  # narrows the float bound to int


class FloatField(_Bounded):
    type: Literal["float"]


InputField = Annotated[FloatArrayField | IntegerField | FloatField, Field(discriminator="type")]


class InputSchema(BaseModel):
    """The features a model takes: an embedding and a node count (seed 000, step 4)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    embedding: FloatArrayField
    node_count: IntegerField

    @model_validator(mode="before")
    @classmethod
    def _default_embedding_length(cls, data: Any, info: ValidationInfo) -> Any:
        """An embedding without ``length`` takes the ``embedding_dim`` of the validation context, if any."""
        default = (info.context or {}).get("embedding_dim")
        embedding = data.get("embedding") if isinstance(data, dict) else None
        if default is not None and isinstance(embedding, dict) and "length" not in embedding:
            return {**data, "embedding": {**embedding, "length": default}}
        return data


class ModelSpec(BaseModel):
    """One catalog entry."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    seanerbus_uuid: uuid.UUID
    default_alias: str = DEFAULT_ALIAS
    description: str = ""
    input_schema: InputSchema
    tasks: tuple[Annotated[str, Field(pattern=TASK_NAME_PATTERN, max_length=TASK_NAME_MAX)], ...] = ()
    """The tasks this model serves: they seed the task map (``examlops.tasks``) where a task is not mapped yet."""
    task_budgets_ms: tuple[tuple[str, Annotated[float, Field(gt=0, le=MAX_BUDGET_MS, allow_inf_nan=False)]], ...] = ()
    """Optional, a mapping in YAML (``task: milliseconds``): the default budget a task this model lists is
    seeded with; every key must be a task in ``tasks``. A task not named has no default budget. Kept as
    sorted ``(task, ms)`` pairs, lower-cased, so that the entry stays hashable; ``budget_of`` reads it."""

    @model_validator(mode="before")
    @classmethod
    def _budgets_as_pairs(cls, data: Any) -> Any:
        budgets = data.get("task_budgets_ms") if isinstance(data, dict) else None
        if isinstance(budgets, dict):
            pairs = sorted((str(task).lower(), budget) for task, budget in budgets.items())
            return {**data, "task_budgets_ms": tuple(pairs)}
        return data

    @model_validator(mode="after")
    def _budgets_name_listed_tasks(self) -> ModelSpec:
        unknown = sorted({task for task, _ in self.task_budgets_ms} - {task.lower() for task in self.tasks})
        if unknown:
            raise ValueError(f"task_budgets_ms names tasks the model does not list in tasks: {', '.join(unknown)}")
        return self

    def budget_of(self, task: str) -> float | None:
        """The default budget the catalog names for ``task`` (any case), in milliseconds; None: none."""
        return dict(self.task_budgets_ms).get(task.lower())

    @property
    def embedding_dim(self) -> int:
        return self.input_schema.embedding.length

    @property
    def min_node_count(self) -> int:
        minimum = self.input_schema.node_count.minimum
        return 1 if minimum is None else minimum

    @property
    def default_alias_canonical(self) -> str:
        return canonical_alias(self.default_alias)


@dataclass(frozen=True)
class Catalog:
    """The loaded catalog, looked up by name (case-insensitive) or by bus UUID."""

    models: tuple[ModelSpec, ...]
    source: Path | None = None

    def __iter__(self) -> Iterator[ModelSpec]:
        return iter(self.models)

    def __len__(self) -> int:
        return len(self.models)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(m.name for m in self.models)

    def get(self, name: str) -> ModelSpec:
        lowered = name.lower()
        for spec in self.models:
            if spec.name.lower() == lowered:
                return spec
        shown = name if len(name) <= 64 else name[:64] + "…"  # never echo more of a caller's string
        raise ModelNotFound(f"model {shown!r} is not in the catalog (known: {', '.join(self.names)})")

    def only(self, names: Iterable[str]) -> Catalog:
        """The catalog restricted to ``names`` (case-insensitive, in catalog order); ``ModelNotFound`` names
        every unknown one. No names at all is an error too: a bridge serving nothing is a mistake."""
        wanted = {name.lower(): name for name in names}
        if not wanted:
            raise ModelNotFound(f"no model named (known: {', '.join(self.names)})")
        unknown = [name for lowered, name in wanted.items() if lowered not in {n.lower() for n in self.names}]
        if unknown:
            raise ModelNotFound(f"not in the catalog: {', '.join(map(repr, unknown))} (known: {', '.join(self.names)})")
        return Catalog(tuple(m for m in self.models if m.name.lower() in wanted), self.source)

    def by_uuid(self, address: str | uuid.UUID) -> ModelSpec:
        try:
            wanted = address if isinstance(address, uuid.UUID) else uuid.UUID(str(address))
        except ValueError as exc:
            raise ModelNotFound(f"{str(address)[:64]!r} is not a model address (a UUID)") from exc
        for spec in self.models:
            if spec.seanerbus_uuid == wanted:
                return spec
        raise ModelNotFound(f"no model has the bus address {wanted}")

    def by_task(self, task: str) -> ModelSpec:
        for spec in self.models:
            if task in spec.tasks:
                return spec
        raise ModelNotFound(f"no model serves the task {task[:64]!r}")


def _field_path(loc: tuple[int | str, ...]) -> str:
    return ".".join(str(part) for part in loc) or "(document)"


def parse_model_spec(data: Any, file: str, *, embedding_dim: int = DEFAULT_EMBEDDING_DIM) -> ModelSpec:
    """Validate one catalog document; the error names the file and the first bad field.

    An embedding that gives no ``length`` gets ``embedding_dim``.
    """
    if not isinstance(data, dict):
        raise CatalogError("the document must be a mapping of fields", file=file)
    try:
        return ModelSpec.model_validate(data, context={"embedding_dim": embedding_dim})
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = tuple(first["loc"])
        message = first["msg"]
        if first["type"] == "union_tag_invalid" or (loc and loc[-1] == "type"):
            message = f"unknown type {first.get('input')!r} (expected float_array, integer or float)"
        elif loc == ("seanerbus_uuid",):
            message = f"{str(first.get('input'))[:64]!r} is not a UUID"
        raise CatalogError(message, file=file, field=_field_path(loc)) from exc


def load_catalog(folder: Path, *, embedding_dim: int = DEFAULT_EMBEDDING_DIM) -> Catalog:
    """Load every ``*.yaml``/``*.yml`` in ``folder``; refuse the catalog on the first problem.

    ``embedding_dim`` is the length of every embedding whose YAML gives none (``bootstrap.catalog`` passes
    ``settings.embedding_dim``); a length a YAML gives wins.
    """
    if not folder.is_dir():
        raise CatalogError(f"catalog folder {folder} does not exist")
    files = sorted([*folder.glob("*.yaml"), *folder.glob("*.yml")])
    if not files:
        raise CatalogError(f"catalog folder {folder} holds no *.yaml file")
    specs: list[ModelSpec] = []
    names: dict[str, str] = {}
    uuids: dict[uuid.UUID, str] = {}
    for path in files:
        try:
            data = yaml.safe_load(path.read_text(encoding="utf-8"))
        except yaml.YAMLError as exc:
            raise CatalogError(f"not valid YAML ({exc})", file=path.name) from exc
        spec = parse_model_spec(data, path.name, embedding_dim=embedding_dim)
        if spec.name.lower() in names:
            raise CatalogError(
                f"duplicate model name {spec.name!r} (also in {names[spec.name.lower()]})",
                file=path.name,
                field="name",
            )
        if spec.seanerbus_uuid in uuids:
            raise CatalogError(
                f"duplicate seanerbus_uuid {spec.seanerbus_uuid} (also in {uuids[spec.seanerbus_uuid]})",
                file=path.name,
                field="seanerbus_uuid",
            )
        names[spec.name.lower()] = path.name
        uuids[spec.seanerbus_uuid] = path.name
        specs.append(spec)
    return Catalog(models=tuple(specs), source=folder)
