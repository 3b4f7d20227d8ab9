"""Fakes at the serving core's ports: they record what happened and can be steered."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from examlops.core.errors import (
    AliasNotFound,
    InferenceFailed,
    ModelLoadError,
    ModelNotFound,
    RegistryUnavailable,
    StoreUnavailable,
    VersionNotFound,
)
from examlops.core.messages import ModelRef, canonical_alias
from examlops.registry.catalog import Catalog, ModelSpec

DIM = 4


def make_spec(name: str, *, dim: int = DIM, min_node_count: int = 1) -> ModelSpec:
    return ModelSpec.model_validate(
        {
            "name": name,
            "seanerbus_uuid": str(uuid.uuid5(uuid.NAMESPACE_DNS, name)),
            "input_schema": {
                "embedding": {"type": "float_array", "length": dim},
                "node_count": {"type": "integer", "minimum": min_node_count},
            },
        }
    )


def make_catalog(*names: str, dim: int = DIM) -> Catalog:
    return Catalog(models=tuple(make_spec(name, dim=dim) for name in names))


class InMemoryModelSource:
    """A registry in memory: versions and aliases that tests can move, remove or make unreachable."""

    def __init__(self) -> None:
        self.versions: dict[str, dict[str, ModelRef]] = {}
        self.alias_map: dict[str, dict[str, str]] = {}
        self.unavailable = False
        self.calls: list[tuple[str, ...]] = []

    def add(self, name: str, version: str, *aliases: str) -> ModelRef:
        ref = ModelRef(name, version, f"run-{name.lower()}-{version}", f"mem://{name}/{version}")
        self.versions.setdefault(name.lower(), {})[version] = ref
        self.alias_map.setdefault(name.lower(), {})
        for alias in aliases:
            self.move(name, alias, version)
        return ref

    def move(self, name: str, alias: str, version: str) -> None:
        assert version in self.versions[name.lower()]
        self.alias_map[name.lower()][canonical_alias(alias)] = version

    def remove_alias(self, name: str, alias: str) -> None:
        del self.alias_map[name.lower()][canonical_alias(alias)]

    def _model(self, name: str) -> dict[str, ModelRef]:
        if self.unavailable:
            raise RegistryUnavailable("the registry is down")
        if name.lower() not in self.versions:
            raise ModelNotFound(f"no model {name}")
        return self.versions[name.lower()]

    def aliases(self, name: str) -> Mapping[str, ModelRef]:
        self.calls.append(("aliases", name))
        versions = self._model(name)
        return {alias: versions[v] for alias, v in self.alias_map[name.lower()].items()}

    def resolve(self, name: str, alias: str) -> ModelRef:
        refs = self.aliases(name)
        if canonical_alias(alias) not in refs:
            raise AliasNotFound(f"{name} has no alias {alias}")
        return refs[canonical_alias(alias)]

    def version(self, name: str, version: str) -> ModelRef:
        self.calls.append(("version", name, version))
        versions = self._model(name)
        if version not in versions:
            raise VersionNotFound(f"{name} has no version {version}")
        return versions[version]

    def fetch(self, ref: ModelRef) -> str:
        self.calls.append(("fetch", ref.name, ref.version))
        self._model(ref.name)
        return ref.source


@dataclass
class RecordingRuntime:
    """Records load/unload/predict; predicts ``version * 1000 + node_count`` so tests see who answered.

    Steering: ``fail_load`` keys refuse to load; ``predict_errors`` are raised by the next predicts in
    order; ``gate`` (an Event set by the test) holds every predict until it is set. Predicting with a
    key that is not loaded fails, which is how tests catch a version released under a request.
    """

    loaded: set[str] = field(default_factory=set)
    events: list[tuple[str, str]] = field(default_factory=list)
    loads: list[str] = field(default_factory=list)
    unloads: list[str] = field(default_factory=list)
    predicts: list[tuple[str, int]] = field(default_factory=list)
    fail_load: set[str] = field(default_factory=set)
    predict_errors: list[Exception] = field(default_factory=list)
    gate: asyncio.Event | None = None
    started: asyncio.Event | None = None
    running: bool = False

    async def start(self) -> None:
        self.running = True

    async def close(self) -> None:
        self.running = False

    async def load(self, key: str, location: str) -> None:
        self.loads.append(key)
        self.events.append(("load", key))
        await asyncio.sleep(0)
        if key in self.fail_load:
            raise ModelLoadError(f"{key}: the artifact is corrupt")
        self.loaded.add(key)

    async def unload(self, key: str) -> None:
        self.unloads.append(key)
        self.events.append(("unload", key))
        self.loaded.discard(key)

    async def predict(self, key: str, rows: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        self.predicts.append((key, len(rows)))
        self.events.append(("predict", key))
        if self.started is not None:
            self.started.set()
        if self.gate is not None:
            await self.gate.wait()
        if self.predict_errors:
            raise self.predict_errors.pop(0)
        if key not in self.loaded:
            raise InferenceFailed(f"{key} is not loaded")
        version = float(key.rsplit("/", 1)[1])
        return np.asarray(version * 1000 + rows[:, -1], dtype=np.float64)


class InMemoryTrafficRules:
    """Traffic rules in a dict, matched case-insensitively; counts reads; can be made unreachable."""

    def __init__(self) -> None:
        self.splits: dict[str, dict[str, int]] = {}
        self.reads = 0
        self.unavailable = False

    def get(self, model: str) -> dict[str, int]:
        self.reads += 1
        if self.unavailable:
            raise StoreUnavailable("SQL is down")
        return dict(self.splits.get(model.lower(), {}))

    def set(self, model: str, weights: Mapping[str, int]) -> None:
        if self.unavailable:
            raise StoreUnavailable("SQL is down")
        self.splits[model.lower()] = dict(weights)


@dataclass
class InMemoryControlTrail:
    """A ``ControlEventSink`` that keeps the events it took; ``down`` (or more than ``down_after`` events) makes
    it raise ``StoreUnavailable``, as the audit trail does when Redis cannot be reached."""

    events: list[tuple[str, str, dict[str, Any]]] = field(default_factory=list)
    down: bool = False
    down_after: int | None = None

    def __call__(self, type: str, subject: str, data: Mapping[str, Any]) -> None:
        if self.down or (self.down_after is not None and len(self.events) >= self.down_after):
            raise StoreUnavailable("cannot append to the audit trail: Timeout reading from 127.0.0.1:18004")
        self.events.append((type, subject, dict(data)))


class FakeClock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds
