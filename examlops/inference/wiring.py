"""Wiring and the composition: which adapter answers each spec name, and the ``Inference`` that holds them.

- ``Wiring(routes)`` maps each spec name to one target: an adapter's target object (``LocalTarget``,
  whose class names its adapter in ``adapter``), or an ``Adapter`` instance itself (a
  ``MockInferenceRegistry``; routes given the same instance share it). ``Wiring.from_yaml(path)`` reads
  ``routes: {name: {adapter: <registered name>, ...its settings}}`` and optional
  ``adapters: {<name>: {...settings shared by its routes}}``; a file that does not parse is VALIDATION
  ``inference_wiring_invalid``. ``emulate_streaming`` lists routes whose backend may answer
  ``predict_stream`` one ``predict_batch`` per chunk although it does not stream.
- Adapters plug in by name: ``register_adapter("examlops", factory)``; ``factory(targets, settings)`` gets
  every route wired to that name (route -> its target object or YAML mapping) and that adapter's shared
  settings, and returns one ``Adapter`` serving them all. ``local`` is registered here; an unknown name
  is VALIDATION ``inference_wiring_invalid``.
- ``Inference.from_wiring(wiring)`` builds the adapters (``policy`` wraps each one: the resilience
  policies' hook); ``await start()`` starts every adapter and fails closed (the started ones closed
  again) when one cannot start; ``model(SPEC)`` gives the typed ``InferencePort``; an unknown name is
  PRECONDITION ``inference_route_unknown``; ``await close()`` closes every adapter.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

from examlops.inference.capture import CaptureHook
from examlops.inference.errors import InferenceError, Kind, route_unknown
from examlops.inference.port import InferencePort
from examlops.inference.ports import Adapter
from examlops.inference.spec import I, InferenceSpec, O

AdapterFactory = Callable[[Mapping[str, Any], Mapping[str, Any]], Adapter]
_FACTORIES: dict[str, AdapterFactory] = {}


def register_adapter(name: str, factory: AdapterFactory) -> None:
    """Make ``name`` usable in wirings (replacing a factory registered under it)."""
    _FACTORIES[name] = factory


def registered_adapters() -> list[str]:
    return sorted(_FACTORIES)


def _wiring_invalid(message: str, route: str = "") -> InferenceError:
    return InferenceError(Kind.VALIDATION, message, code="inference_wiring_invalid", route=route)


class _RouteFile(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True)
    adapter: str
    emulate_streaming: bool = False


class _WiringFile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    routes: dict[str, _RouteFile]
    adapters: dict[str, dict[str, Any]] = {}
    policy: dict[str, Any] | None = None


@dataclass(frozen=True)
class Wiring:
    """Spec name -> target; see the module docstring."""

    routes: Mapping[str, object]
    adapters: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    emulate_streaming: Collection[str] = ()
    policy: Mapping[str, Any] | None = None
    """A resilience policy (``examlops.inference.resilience.Policy``) put around every adapter; None: none."""

    @classmethod
    def from_yaml(cls, path: str | Path) -> Wiring:
        try:
            loaded = _WiringFile.model_validate(yaml.safe_load(Path(path).read_text()))
        except (OSError, yaml.YAMLError, ValidationError) as exc:
            raise _wiring_invalid(f"the wiring file {path} is not valid: {exc}"[:800]) from exc
        routes: dict[str, object] = {}
        for name, route in loaded.routes.items():
            routes[name] = _FileTarget(route.adapter, dict(route.model_extra or {}))
        emulated = [name for name, route in loaded.routes.items() if route.emulate_streaming]
        return cls(routes, loaded.adapters, emulated, loaded.policy)


@dataclass(frozen=True)
class _FileTarget:
    adapter: str
    settings: dict[str, Any]


def _adapter_name(route: str, target: object) -> str:
    name = getattr(target, "adapter", None)
    if not isinstance(name, str):
        raise _wiring_invalid(f"the route {route!r} has no adapter ({type(target).__name__})", route)
    return name


def build_adapters(wiring: Wiring) -> dict[str, Adapter]:
    """Route -> the adapter answering it, one adapter per registered name (and per given instance)."""
    by_route: dict[str, Adapter] = {}
    groups: dict[str, dict[str, Any]] = {}
    for route, target in wiring.routes.items():
        if isinstance(target, Adapter):
            by_route[route] = target
            continue
        name = _adapter_name(route, target)
        groups.setdefault(name, {})[route] = target.settings if isinstance(target, _FileTarget) else target
    for name, targets in groups.items():
        factory = _FACTORIES.get(name)
        if factory is None:
            known = ", ".join(registered_adapters())
            raise _wiring_invalid(f"no adapter is registered as {name!r} (known: {known})", next(iter(targets)))
        adapter = factory(targets, wiring.adapters.get(name, {}))
        by_route.update(dict.fromkeys(targets, adapter))
    return by_route


class Inference:
    """The composition: adapters built from a wiring, started and closed together; ports by spec."""

    def __init__(
        self,
        adapters: Mapping[str, Adapter],
        *,
        emulate_streaming: Collection[str] = (),
        on_capture: CaptureHook | None = None,
    ) -> None:
        self._adapters = dict(adapters)
        self._emulate_streaming = frozenset(emulate_streaming)
        self._on_capture = on_capture
        self._started: list[Adapter] = []

    @classmethod
    def from_wiring(
        cls,
        wiring: Wiring | str | Path,
        *,
        on_capture: CaptureHook | None = None,
        policy: Callable[[Adapter], Adapter] | None = None,
    ) -> Inference:
        if not isinstance(wiring, Wiring):
            wiring = Wiring.from_yaml(wiring)
        adapters = build_adapters(wiring)
        if policy is None and wiring.policy is not None:
            policy = _resilient(wiring.policy)
        if policy is not None:
            wrapped: dict[int, Adapter] = {}
            for adapter in adapters.values():
                if id(adapter) not in wrapped:
                    wrapped[id(adapter)] = policy(adapter)
            adapters = {route: wrapped[id(adapter)] for route, adapter in adapters.items()}
        return cls(adapters, emulate_streaming=wiring.emulate_streaming, on_capture=on_capture)

    def _distinct(self) -> list[Adapter]:
        seen: dict[int, Adapter] = {}
        for adapter in self._adapters.values():
            seen.setdefault(id(adapter), adapter)
        return list(seen.values())

    async def start(self) -> None:
        """Start (warm) every adapter; on a failure close the started ones and raise it."""
        for adapter in self._distinct():
            if any(adapter is started for started in self._started):
                continue
            try:
                await adapter.start()
            except BaseException:
                await self.close()
                raise
            self._started.append(adapter)

    async def close(self) -> None:
        """Close every started adapter (each close is attempted; the first error is raised after)."""
        started, self._started = self._started, []
        first: BaseException | None = None
        for adapter in reversed(started):
            try:
                await adapter.close()
            except Exception as exc:
                first = first or exc
        if first is not None:
            raise first

    async def __aenter__(self) -> Inference:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def model(self, spec: InferenceSpec[I, O]) -> InferencePort[I, O]:
        adapter = self._adapters.get(spec.name)
        if adapter is None:
            raise route_unknown(spec.name)
        return InferencePort(
            spec, adapter, on_capture=self._on_capture, emulate_streaming=spec.name in self._emulate_streaming
        )


def _local(targets: Mapping[str, Any], settings: Mapping[str, Any]) -> Adapter:
    from examlops.inference.adapters.local import local_adapter

    return local_adapter(targets, settings)


def _resilient(data: Mapping[str, Any]) -> Callable[[Adapter], Adapter]:
    from examlops.inference.resilience import Policy, ResilientAdapter

    policy = Policy.from_mapping(data)
    return lambda adapter: ResilientAdapter(adapter, policy)


def _examlops(targets: Mapping[str, Any], settings: Mapping[str, Any]) -> Adapter:
    from examlops.inference.adapters.examlops import examlops_adapter

    return examlops_adapter(targets, settings)


def _kserve_v2(targets: Mapping[str, Any], settings: Mapping[str, Any]) -> Adapter:
    from examlops.inference.adapters.kserve_v2 import kserve_v2_adapter

    return kserve_v2_adapter(targets, settings)


def _mlflow(targets: Mapping[str, Any], settings: Mapping[str, Any]) -> Adapter:
    from examlops.inference.adapters.mlflow import mlflow_adapter

    return mlflow_adapter(targets, settings)


register_adapter("local", _local)
register_adapter("examlops", _examlops)
register_adapter("kserve_v2", _kserve_v2)
register_adapter("mlflow", _mlflow)
