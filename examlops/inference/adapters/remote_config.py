"""What a wiring file may say to the remote adapters (``examlops``, ``kserve_v2``, ``mlflow``), checked.

Each remote adapter's route mapping and shared ``adapters: {<name>: ...}`` settings are read through one
pydantic model with ``extra="forbid"``: a misspelt key (``fromat``, ``tokn``), a missing ``url`` or
``model``, a value of the wrong type or a combination the target refuses (a task with an alias, a
columns list without the dataframe format) is VALIDATION ``inference_wiring_invalid`` naming the
backend and the route, when the adapters are built, never a ``KeyError`` or a silently ignored key.

A target object given from Python (``ExamlopsTarget``, ``V2Target``, ``MlflowTarget``) is used as it is.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from examlops.inference.errors import InferenceError, Kind

A = TypeVar("A")
T = TypeVar("T")
M = TypeVar("M", bound=BaseModel)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ExamlopsSettings(_Strict):
    url: str
    token: str | None = None
    max_batch: int = Field(default=64, ge=1)
    default_timeout_s: float = Field(default=30.0, gt=0)


class KserveV2Settings(_Strict):
    url: str
    token: str | None = None
    max_batch: int | None = Field(default=None, ge=1)
    default_timeout_s: float = Field(default=30.0, gt=0)


class MlflowSettings(_Strict):
    url: str | None = None
    max_batch: int | None = Field(default=None, ge=1)
    default_timeout_s: float = Field(default=30.0, gt=0)


class ExamlopsRoute(_Strict):
    task: str | None = None
    model: str | None = None
    alias: str | None = None
    version: int | None = None
    outputs: tuple[str, ...] = ("prediction",)
    reply_fields: tuple[str, ...] = ()


class TensorRoute(_Strict):
    name: str = "input-0"
    fields: tuple[str, ...] | None = None
    datatype: str = "FP64"
    flat: bool = False


class V2Route(_Strict):
    model: str
    version: str | None = Field(default=None, coerce_numbers_to_str=True)
    inputs: Literal["examlops"] | list[TensorRoute] | None = None
    output: str | None = None
    outputs: tuple[str, ...] = ("prediction",)
    parameters: dict[str, Any] = {}


class MlflowRoute(_Strict):
    url: str | None = None
    format: Literal["tensor", "dataframe"] = "tensor"
    fields: tuple[str, ...] | None = None
    columns: tuple[str, ...] | None = None
    outputs: tuple[str, ...] = ("prediction",)


def checked(backend: str, route: str, build: Callable[[A], T], raw: A) -> T:
    """``build(raw)``, a wiring error (pydantic's or a target's own ``ValueError``) as ``inference_wiring_invalid``."""
    try:
        return build(raw)
    except (ValidationError, ValueError, TypeError) as exc:
        where = f"the {backend} route {route!r}" if route else f"the {backend} adapter's settings"
        raise InferenceError(
            Kind.VALIDATION,
            f"{where} is not valid: {exc}"[:800],
            code="inference_wiring_invalid",
            backend=backend,
            route=route,
        ) from exc


def targets_of(backend: str, build: Callable[[A], T], targets: Mapping[str, A]) -> dict[str, T]:
    """Every route's target, each ``checked`` (a wiring error names the route)."""
    return {route: checked(backend, route, build, raw) for route, raw in targets.items()}


def settings_of(model: type[M], backend: str, raw: Any) -> M:
    """The adapter's shared settings, checked."""
    return checked(backend, "", model.model_validate, dict(raw or {}))
