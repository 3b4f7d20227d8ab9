"""In-memory fakes at the promotion's ports: the alias registry (with injectable failures), the move trail,
and serving instances behind httpx's transport seam."""

from __future__ import annotations

import json
from typing import Literal

import httpx

from examlops.core.errors import AliasNotFound, ModelNotFound, RegistryUnavailable, StoreUnavailable, VersionNotFound
from examlops.core.messages import ModelRef, canonical_alias
from examlops.promotion.aliases import AliasMove
from examlops.promotion.trail import AuditedMove, MoveState


class InMemoryAliasRegistry:
    """Registered models with versions, aliases and tags; names match case-insensitively. ``calls`` records every
    call asked of it, ``writes`` the alias and tag writes among them."""

    def __init__(self) -> None:
        self.name = "AC"
        self.versions = {"1", "2", "3"}
        self.aliases: dict[str, str] = {"Production": "1", "Canary": "2"}
        self.tags: dict[str, str] = {}
        self.calls: list[tuple[str, ...]] = []

    @property
    def writes(self) -> list[tuple[str, ...]]:
        return [call for call in self.calls if call[0] in ("set_alias", "set_model_tag")]

    def _check(self, name: str, *call: str) -> None:
        self.calls.append(call)
        if name.lower() != self.name.lower():
            raise ModelNotFound(name)

    def _ref(self, version: str) -> ModelRef:
        return ModelRef(self.name, version, None, f"mem://{version}")

    def resolve(self, name: str, alias: str) -> ModelRef:
        self._check(name, "resolve", alias)
        if canonical_alias(alias) not in self.aliases:
            raise AliasNotFound(alias)
        return self._ref(self.aliases[canonical_alias(alias)])

    def version(self, name: str, version: str) -> ModelRef:
        self._check(name, "version", version)
        if version not in self.versions:
            raise VersionNotFound(version)
        return self._ref(version)

    def set_alias(self, name: str, alias: str, version: str) -> ModelRef | None:
        self._check(name, "set_alias", alias, version)
        before = self.aliases.get(canonical_alias(alias))
        self.aliases[canonical_alias(alias)] = self.version(name, version).version
        return self._ref(before) if before else None

    def model_tags(self, name: str) -> dict[str, str]:
        self._check(name, "model_tags")
        return dict(self.tags)

    def set_model_tag(self, name: str, key: str, value: str) -> None:
        self._check(name, "set_model_tag", key, value)
        self.tags[key] = value


class InMemoryMoveTrail:
    """A ``MoveTrail`` that records its events and keeps the last word per alias, as the audited index does;
    ``fail_on`` makes that kind of event raise ``StoreUnavailable`` (the trail's Redis is down)."""

    def __init__(self, fail_on: frozenset[str] = frozenset()) -> None:
        self.events: list[tuple[str, AliasMove]] = []
        self.unaccounted: list[str | None] = []
        self.errors: list[str] = []
        self.lasts: dict[tuple[str, str], AuditedMove] = {}
        self.fail_on = fail_on

    def _write(self, state: MoveState, move: AliasMove, error: str = "") -> None:
        if state in self.fail_on:
            raise StoreUnavailable("redis is down")
        self.events.append((state, move))
        self.lasts[(move.model, move.alias)] = AuditedMove(
            state, move.model, move.alias, move.old_version, move.new_version, "admin", error
        )

    def intended(self, move: AliasMove, unaccounted: str | None) -> None:
        self._write("intended", move)
        self.unaccounted.append(unaccounted)

    def moved(self, move: AliasMove) -> None:
        self._write("moved", move)

    def failed(self, move: AliasMove, error: BaseException) -> None:
        self.errors.append(str(error))
        self._write("failed", move, str(error))

    def last(self, model: str, alias: str) -> AuditedMove | None:
        return self.lasts.get((model, alias))


class UnreachableRegistry(InMemoryAliasRegistry):
    """Reads work; the alias write fails as a stopped MLflow server does (after the write, when ``applied``)."""

    def __init__(self, *, applied: bool = False) -> None:
        super().__init__()
        self.applied = applied

    def set_alias(self, name: str, alias: str, version: str) -> ModelRef | None:
        if self.applied:
            super().set_alias(name, alias, version)
        raise RegistryUnavailable("the MLflow registry cannot be reached: timed out")


AliasWrite = Literal["ok", "lost", "refused"]
"""How one alias write ends: it moves and replies; it moves and its reply is lost; it is refused."""


class ScriptedRegistry(InMemoryAliasRegistry):
    """Alias writes end as ``script`` says, one entry per write (then ``ok``); versions 1 to 5 exist."""

    def __init__(self, script: list[AliasWrite] | None = None) -> None:
        super().__init__()
        self.versions = {"1", "2", "3", "4", "5"}
        self.script = list(script or [])

    def set_alias(self, name: str, alias: str, version: str) -> ModelRef | None:
        outcome = self.script.pop(0) if self.script else "ok"
        if outcome == "refused":
            raise RegistryUnavailable("the MLflow registry cannot be reached: connection refused")
        before = super().set_alias(name, alias, version)
        if outcome == "lost":
            raise RegistryUnavailable("the MLflow registry cannot be reached: timed out")
        return before


class FakeServing:
    """One serving instance behind httpx.MockTransport: follows the registry on POST /admin/reload."""

    def __init__(self, registry: InMemoryAliasRegistry, *, refuse: set[str] | None = None, lag: bool = False) -> None:
        self.registry = registry
        self.serving = dict(registry.aliases)
        self.refuse = refuse or set()
        self.lag = lag
        self.reloads: list[object] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/admin/reload":
            self.reloads.append(json.loads(request.content))
            changes = []
            for alias, version in self.registry.aliases.items():
                if self.serving.get(alias) == version or self.lag:
                    continue
                if version in self.refuse:
                    changes.append({"alias": alias, "outcome": "refused", "reason": f"version {version} refused: bad"})
                    continue
                changes.append({"alias": alias, "outcome": "swapped"})
                self.serving[alias] = version
            return httpx.Response(200, json={"changes": changes})
        rows = [{"model": "AC", "alias": a, "version": v, "state": "ready"} for a, v in self.serving.items()]
        return httpx.Response(200, json=rows)


class Network(httpx.BaseTransport):
    """Routes by host:port to fake instances; any other address refuses the connection."""

    def __init__(self, hosts: dict[str, FakeServing]) -> None:
        self.hosts = hosts

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        host = f"{request.url.host}:{request.url.port}"
        if host not in self.hosts:
            raise httpx.ConnectError("connection refused", request=request)
        return self.hosts[host](request)


class TagWriteFails(InMemoryAliasRegistry):
    """The alias moves; the write of the tag ``fail_key`` then fails as an unreachable MLflow does."""

    def __init__(self, fail_key: str) -> None:
        super().__init__()
        self.fail_key = fail_key

    def set_model_tag(self, name: str, key: str, value: str) -> None:
        if key == self.fail_key:
            raise RegistryUnavailable("the MLflow registry cannot be reached: connection reset")
        super().set_model_tag(name, key, value)
