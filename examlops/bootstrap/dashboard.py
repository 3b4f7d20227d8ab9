"""The dashboard's sources in the serving process: the same services `exa audit`, `exa drift status`,
`exa bridge status`, `exa loop status`, `exa promote --from Canary` and `exa rollback` use, and Prefect's
flow runs that name a model.

``dashboard_sources(settings, engine, events)`` takes serving's SQL engine and its audit hook; it opens one
Redis client (connecting on first use) and builds the MLflow registry on the first promotion or rollback
only. Nothing here decides: each adapter translates a service's answer into the dashboard's port types.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import cached_property
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from sqlalchemy.engine import Engine

from examlops.bootstrap.control import AuditAccess, AuditHook, audit_moves
from examlops.core.errors import DependencyUnavailable
from examlops.core.settings import Settings
from examlops.dashboard.ports import (
    AuditCheck,
    AuditEntry,
    DashboardSources,
    DriftPoint,
    FailureWindow,
    FlowRun,
    Moved,
)

if TYPE_CHECKING:
    from collections.abc import Sequence

    import redis

    from examlops.registry.catalog import Catalog
    from examlops.registry.mlflow_registry import MlflowRegistry


@dataclass
class _Audit:
    access: AuditAccess
    stale_after_s: float

    def tail(self, n: int) -> list[AuditEntry]:
        import json

        from examlops.monitoring.audit.verify import tail

        out = []
        for event in tail(self.access.store, n, archive=self.access.archive):
            data = event.to_json()
            try:
                actor = str(json.loads(event.data).get("actor", ""))
            except (ValueError, AttributeError):
                actor = ""
            out.append(AuditEntry(event.seq, data["time"], event.type, event.subject, actor, event.data))
        return out

    def last_check(self) -> AuditCheck | None:
        """What `exa audit verify` or the retention flow stored (one GET): serving never walks the chain."""
        from examlops.monitoring.audit.verified import UNREADABLE_BY, last_verify

        found = last_verify(self.access.store.redis, self.access.secret)
        if found is None:
            return None
        broken = None if found.ok else "; ".join(found.problems) or "failed"
        return AuditCheck(
            found.events, found.checkpoints, broken, found.at, found.by, found.last_seq, found.notes,
            self.stale_after_s, readable=found.by != UNREADABLE_BY,
        )  # fmt: skip


@dataclass
class _Drift:
    engine: Engine

    def history(self, model: str, limit: int) -> list[DriftPoint]:
        from examlops.monitoring.drift_store import SqlDriftStore

        return [
            DriftPoint(r.model, r.kind, r.version, r.created_at.timestamp(), r.score, r.threshold, r.drifted,
                       r.report_html)
            for r in SqlDriftStore(self.engine).history(limit, model=model)
        ]  # fmt: skip


MODEL_FLOWS = ("retrain", "canary-analysis", "promote", "drift-report")
"""The control plane's flows (``examlops/flows``): the first three take ``model``, the drift report ``models``."""


@dataclass
class _FlowRuns:
    """Prefect's REST API (``POST /flow_runs/filter``): it cannot filter on parameters, so this reads the newest
    runs of the model flows and keeps those whose ``model`` parameter (or ``models`` list) names the model, and
    the drift reports without a ``models`` list (they report every catalog model)."""

    api_url: str
    timeout_s: float = 5.0
    scan: int = 200  # Prefect's largest page

    def runs(self, model: str, limit: int) -> list[FlowRun]:
        import httpx

        # Runs scheduled for later have not happened: left out by Prefect, or they would fill the scan.
        due = {"operator": "or_", "start_time": {"is_null_": False},
               "expected_start_time": {"before_": datetime.now(UTC).isoformat()}}  # fmt: skip
        body = {"flows": {"name": {"any_": list(MODEL_FLOWS)}}, "flow_runs": due, "sort": "START_TIME_DESC",
                "limit": self.scan}  # fmt: skip
        try:
            reply = httpx.post(f"{self.api_url}/flow_runs/filter", json=body, timeout=self.timeout_s)
            reply.raise_for_status()
            found = reply.json()
            flows = httpx.post(f"{self.api_url}/flows/filter", json={"flows": {"name": {"any_": list(MODEL_FLOWS)}}},
                               timeout=self.timeout_s)  # fmt: skip
            flows.raise_for_status()
            names = {f["id"]: f["name"] for f in flows.json()}
        except (httpx.HTTPError, ValueError) as exc:
            raise DependencyUnavailable(f"Prefect at {self.api_url} did not list flow runs: {exc}") from exc
        ui = self.api_url.removesuffix("/").removesuffix("/api")
        out = []
        for run in found:
            params = run.get("parameters") or {}
            listed = params.get("models")
            every = names.get(run.get("flow_id")) == "drift-report" and not listed  # no models: it reports all
            if not every and params.get("model") != model and model not in (listed or ()):
                continue
            started = run.get("start_time") or run.get("expected_start_time")
            out.append(FlowRun(str(run["id"]), str(run.get("name", "")), names.get(run.get("flow_id"), "?"),
                               str(run.get("state_name") or run.get("state_type") or "?"),
                               datetime.fromisoformat(started).timestamp() if started else None,
                               f"{ui}/runs/flow-run/{run['id']}"))  # fmt: skip
        return out[:limit]


@dataclass
class _Failures:
    client: redis.Redis
    capacity: int

    def windows(self, models: Sequence[str]) -> dict[str, FailureWindow]:
        from examlops.monitoring.failure_store import RedisFailureStore
        from examlops.monitoring.failures import failure_status

        return {
            row.model: FailureWindow(row.model, row.window.rate, row.window.size, row.window.capacity,
                                     row.cooldown_left_s)
            for row in failure_status(RedisFailureStore(self.client), models, self.capacity)
        }  # fmt: skip


@dataclass
class _Loops:
    engine: Engine
    lease_s: float

    def records(self) -> dict[str, dict[str, Any]]:
        from examlops.loop.sql import SqlLoopStore

        now = time.time()
        out = {}
        for record in SqlLoopStore(self.engine).list():
            row = record.to_json()
            row["stale"] = record.stale(now, self.lease_s)
            out[record.model] = row
        return out


@dataclass
class _Promoter:
    settings: Settings
    events: AuditHook

    @cached_property
    def registry(self) -> MlflowRegistry:
        from examlops.bootstrap.serving import model_registry

        return model_registry(self.settings)

    @cached_property
    def catalog(self) -> Catalog:
        from examlops.bootstrap.serving import catalog

        return catalog(self.settings)

    @cached_property
    def redis(self) -> redis.Redis:
        """For the audited aliases' index (``bootstrap.moves``)."""
        from examlops.adapters.redis import connect

        return connect(self.settings.redis_url)

    def promote_canary(self, model: str, actor: str) -> Moved:
        from examlops.promotion.service import promote

        return self._moved(promote(self.settings, self.registry, model, "Production", from_alias="Canary",
                                   **self._follow(actor, "dashboard promote")))  # fmt: skip

    def rollback(self, model: str, actor: str) -> Moved:
        from examlops.promotion.service import rollback

        return self._moved(rollback(self.settings, self.registry, model, "Production",
                                    **self._follow(actor, "dashboard rollback")))  # fmt: skip

    def _follow(self, actor: str, by: str) -> dict[str, Any]:
        from examlops.bootstrap.identity import platform_token

        trail = audit_moves(self.events, self.redis, actor, by)
        return {"trail": trail, "token": platform_token(self.settings), "catalog": self.catalog}

    @staticmethod
    def _moved(result: Any) -> Moved:
        """The service's result, with its warnings (``PromotionResult.unaccounted`` first)."""
        before = (f"the audit trail did not account for this alias before the move: {result.unaccounted}",)
        warnings = (before if result.unaccounted else ()) + tuple(result.warnings)
        return Moved(result.model, result.old_version, result.new_version, tuple(result.instances), warnings,
                     result.nothing_to_do)  # fmt: skip


def ui_links(settings: Settings) -> dict[str, str]:
    """The MLflow and Prefect UIs the pages link to: the external URLs when set, else the embedded ones'."""
    tracking = settings.mlflow_tracking_uri
    mlflow = (tracking.rstrip("/") if urlsplit(tracking).scheme in ("http", "https")
              else f"http://127.0.0.1:{settings.mlflow.ui_port}")  # fmt: skip
    return {"mlflow": mlflow, "prefect": settings.prefect_api_url.removesuffix("/").removesuffix("/api")}


def dashboard_sources(settings: Settings, engine: Engine, events: AuditHook) -> DashboardSources:
    from examlops.adapters.redis import connect

    return DashboardSources(
        audit=_Audit(AuditAccess(settings), settings.audit.verify_stale_s),
        drift=_Drift(engine),
        failures=_Failures(connect(settings.redis_url), settings.failure.window),
        loops=_Loops(engine, settings.loop.lease_s),
        promoter=_Promoter(settings, events),
        runs=_FlowRuns(settings.prefect_api_url.removesuffix("/")),
        links=ui_links(settings),
    )
