"""The closed loop against real Redis, MLflow (SQLite), serving and Prefect (``prefect_test_harness``): a canary
that passes is promoted on the serving instance, one that fails gets share 0, one without traffic ends
undecided, an abort restores the split, a failure trigger within the grace period rolls the promotion back,
and a candidate worse than Production never reaches Canary.

Windows are shortened through ``EXAMLOPS_LOOP__*``; the latency gate gets a wide slack (it is judged in the
unit tests; here two versions share one busy machine). Traffic is direct HTTP to the model's default alias,
which the split divides and serving traces.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import redis

from examlops.bootstrap import upgrade_database
from examlops.core.settings import Settings
from examlops.registry.catalog import load_catalog
from examlops.registry.demo import seed_demo
from examlops.registry.mlflow_registry import MlflowRegistry
from tests.integration.servers import ServingProcess

pytestmark = [
    pytest.mark.integration,
    pytest.mark.timeout(300),
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::FutureWarning"),
    pytest.mark.filterwarnings("ignore::UserWarning:evidently.*"),
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
]

LOOP_ENV = {
    "EXAMLOPS_LOOP__CANARY_SHARE": "50",
    "EXAMLOPS_LOOP__MIN_REQUESTS": "20",
    "EXAMLOPS_LOOP__MIN_SECONDS": "3",
    "EXAMLOPS_LOOP__MAX_SECONDS": "40",
    "EXAMLOPS_LOOP__POLL_S": "0.5",
    "EXAMLOPS_LOOP__P99_SLACK_MS": "2000",
    "EXAMLOPS_TRAFFIC__RULES_TTL_S": "1",
}


@dataclass(frozen=True)
class Site:
    home: Path
    env: dict[str, str]
    settings: Settings
    registry: MlflowRegistry
    redis: redis.Redis
    server: ServingProcess


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory, redis_server: str) -> Iterator[Site]:
    root = tmp_path_factory.mktemp("loop")
    home = root / "state"
    home.mkdir()
    settings = Settings(home=home, redis={"url": redis_server})
    seed_demo(settings, load_catalog(settings.catalog_path))
    upgrade_database(settings)
    server = ServingProcess(home, env={
        "EXAMLOPS_PREDICT__WORKERS": "1", "EXAMLOPS_HOTSET__RELOAD_POLL_S": "0", "EXAMLOPS_REDIS__URL": redis_server,
        "EXAMLOPS_TRAFFIC__RULES_TTL_S": "1",
    })  # fmt: skip
    env = {"EXAMLOPS_HOME": str(home), "EXAMLOPS_REDIS__URL": redis_server, **LOOP_ENV}
    env["EXAMLOPS_SERVING__INSTANCES"] = json.dumps([server.url])
    try:
        server.wait_ready()
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("PREFECT_HOME", str(settings.prefect_home))
            mp.setenv("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
            mp.setenv("MLFLOW_DISABLE_TELEMETRY", "true")
            mp.chdir(root)
            from prefect.testing.utilities import prefect_test_harness

            with prefect_test_harness(server_startup_timeout=90):
                client = redis.Redis.from_url(redis_server, decode_responses=True)
                registry = MlflowRegistry(settings.mlflow_tracking_uri, home / "cache")
                yield Site(home, env, settings, registry, client, server)
                client.close()
    finally:
        server.stop()


@pytest.fixture
def loop_env(site: Site, monkeypatch: pytest.MonkeyPatch) -> Site:
    """The flows build their Settings from the environment, as the served deployments do."""
    for name, value in site.env.items():
        monkeypatch.setenv(name, value)
    return site


class Traffic:
    """Direct HTTP calls to one model's default alias, one after another, until stopped; replies by version."""

    def __init__(self, site: Site, model: str) -> None:
        self.url = f"{site.server.url}/v1/models/{model}/predict"
        self.headers = site.server.auth
        self.served: dict[str, int] = {}
        self.errors: dict[str, int] = {}
        self.lost = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        rng = np.random.default_rng(3)
        self.bodies = [{"embedding": [float(v) for v in rng.normal(0, 0.05, 384)], "node_count": 12} for _ in range(32)]

    def __enter__(self) -> Traffic:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        with httpx.Client(timeout=10, headers=self.headers) as client:
            i = 0
            while not self._stop.is_set():
                i += 1
                try:
                    reply = client.post(self.url, json=self.bodies[i % len(self.bodies)])
                except httpx.TransportError:
                    self.lost += 1
                    continue
                body = reply.json()
                if reply.status_code == 200:
                    self.served[body["version"]] = self.served.get(body["version"], 0) + 1
                else:
                    code = body.get("code", str(reply.status_code))
                    self.errors[code] = self.errors.get(code, 0) + 1
                self._stop.wait(0.01)


def serving_versions(site: Site, model: str) -> dict[str, str]:
    rows = httpx.get(f"{site.server.url}/v1/models", timeout=5, headers=site.server.auth).json()
    return {r["alias"]: r["version"] for r in rows if r["model"] == model}


def events_of(site: Site, model: str) -> list[tuple[str, dict[str, Any]]]:
    from examlops.monitoring.audit import tail

    return [(e.type, json.loads(e.data)) for e in tail(site.redis, 500) if e.subject == model]


def loop_record(site: Site, model: str) -> Any:
    from examlops.bootstrap.loop import loop_store

    with loop_store(site.settings) as store:
        return store.get(model)


def test_a_passing_canary_is_promoted_everywhere_and_a_failure_within_grace_rolls_it_back(loop_env: Site) -> None:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    from examlops.flows.canary import canary_flow
    from examlops.flows.retrain import retrain_flow
    from examlops.serving.traffic_store import SqlTrafficRuleStore

    site = loop_env
    assert serving_versions(site, "AC") == {"Production": "1", "Canary": "2", "Staging": "3"}
    with Traffic(site, "AC") as traffic:
        result = canary_flow(model="AC")
    assert result["decision"] == "pass", result
    assert result["canary"]["requests"] >= 20 and result["canary"]["model_failures"] == 0
    assert traffic.lost == 0 and traffic.errors == {} and set(traffic.served) == {"1", "2"}
    assert site.registry.resolve("AC", "Production").version == "2"
    assert serving_versions(site, "AC")["Production"] == "2"
    from examlops.bootstrap.sql import sql_engine

    engine = sql_engine(site.settings)
    assert SqlTrafficRuleStore(engine).get("AC") == {}  # the split is back as it was: none
    engine.dispose()
    record = loop_record(site, "AC")
    assert record.phase.value == "promoted" and record.replaced_version == "1" and record.promoted_at is not None
    types = [t for t, _ in events_of(site, "AC")]
    assert "loop.canary_started" in types and "loop.decided" in types and "alias.moved" in types
    decided = [d for t, d in events_of(site, "AC") if t == "loop.decided"][-1]
    assert {g["gate"] for g in decided["gates"]} == {"failures", "latency", "drift", "refusals"}
    with get_client(sync_client=True) as client:
        found = client.read_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=["canary-ac", "canary-ac-plot"]))
        )
    assert {a.type for a in found} == {"table", "markdown"}

    # The promoted version fails (its calls traced as serving traces them), and the failure trigger fires
    # within the grace period: the promotion is rolled back, not retrained.
    from examlops.tracing.record import TraceRecord, new_trace_id
    from examlops.tracing.sql_store import SqlTraceStore

    now = time.time()
    failing = [
        TraceRecord(new_trace_id(), now, "bus", "failed", "inference_failed", "AC", "Production", "2", status=500)
        for _ in range(30)
    ]
    engine = sql_engine(site.settings)
    SqlTraceStore(engine).add(failing)
    engine.dispose()
    summary = retrain_flow(model="AC", reason="failure rate 50/50 = 1.00 >= 0.5", source="failure-trigger",
                           requested_at=now)  # fmt: skip
    assert summary["action"] == "rolled_back" and summary["retrain"] is None
    assert site.registry.resolve("AC", "Production").version == "1"
    assert serving_versions(site, "AC")["Production"] == "1"
    assert loop_record(site, "AC").phase.value == "rolled_back"
    assert "loop.rolled_back" in [t for t, _ in events_of(site, "AC")]


def test_a_failing_canary_gets_share_zero_and_production_stays(loop_env: Site) -> None:
    from examlops.flows.canary import canary_flow

    site = loop_env
    site.registry.set_alias("CRCP", "Canary", "3")  # the demo version that fails on every row
    httpx.post(f"{site.server.url}/admin/reload", headers=site.server.auth, timeout=60).raise_for_status()
    with Traffic(site, "CRCP") as traffic:
        result = canary_flow(model="CRCP")
    assert result["decision"] == "fail" and [g["gate"] for g in result["gates"] if g["passed"] is False] == ["failures"]
    assert result["canary"]["model_failures"] == result["canary"]["requests"] > 0
    assert traffic.lost == 0 and set(traffic.errors) == {"inference_failed"}
    assert site.registry.resolve("CRCP", "Production").version == "1"
    assert serving_versions(site, "CRCP")["Production"] == "1"
    assert loop_record(site, "CRCP").phase.value == "rejected"


def test_an_analysis_without_traffic_ends_undecided_and_an_abort_restores_the_split(
    loop_env: Site, monkeypatch: pytest.MonkeyPatch
) -> None:
    from examlops.bootstrap.loop import closed_loop
    from examlops.flows.canary import canary_flow
    from examlops.loop.abort import abort_analysis

    site = loop_env
    monkeypatch.setenv("EXAMLOPS_LOOP__MAX_SECONDS", "4")
    result = canary_flow(model="JPCP")
    assert result["decision"] == "undecided" and result["canary"]["requests"] == 0
    assert site.registry.resolve("JPCP", "Production").version == "1"
    assert loop_record(site, "JPCP").phase.value == "undecided"

    monkeypatch.setenv("EXAMLOPS_LOOP__MAX_SECONDS", "120")
    outcome: dict[str, Any] = {}
    runner = threading.Thread(target=lambda: outcome.update(canary_flow(model="JPCP")))
    runner.start()
    import time

    with closed_loop(Settings()) as parts:
        deadline = time.monotonic() + 60  # the run loads Canary everywhere, then sets the split
        while parts.traffic.get("JPCP") != {"Production": 50, "Canary": 50} and time.monotonic() < deadline:
            time.sleep(0.2)
        assert loop_record(site, "JPCP").phase.value == "canary"
        aborted = abort_analysis(parts, "JPCP", actor="tests")
        assert aborted.how == "asked"
        runner.join(30)
        assert outcome["decision"] == "aborted"
        assert parts.traffic.get("JPCP") == {}
    assert loop_record(site, "JPCP").phase.value == "aborted"


def test_a_candidate_worse_than_production_is_registered_but_never_reaches_canary(loop_env: Site) -> None:
    from examlops.bootstrap.inference import holdout_scorer
    from examlops.bootstrap.loop import closed_loop
    from examlops.loop.cycle import retrain_cycle
    from examlops.registry.retrain import SyntheticDataSource, retrain

    site = loop_env

    class ShuffledTargets(SyntheticDataSource):
        """Training rows whose targets are shuffled: the candidate learns nothing, and its evaluation says so."""

        def sample(self, spec: Any, rows: int, seed: int) -> Any:
            data = super().sample(spec, rows, seed)
            if rows != 800:
                return data
            return type(data)(data.embeddings, data.node_count, np.random.default_rng(seed).permutation(data.target))

    spec = load_catalog(site.settings.catalog_path).get("JPCP")
    canary_before = site.registry.resolve("JPCP", "Canary").version
    settings = Settings()
    score = holdout_scorer(settings)

    def worse() -> Any:
        return retrain(settings, site.registry, spec, ShuffledTargets(), score=score, seed=5)

    with closed_loop(settings, actor="tests") as parts:
        cycle = retrain_cycle(
            parts, "JPCP", owner="tests", run="tests", from_trigger=False, retrain=worse,
            analyse=lambda: pytest.fail("a worse candidate was analysed"),
        )  # fmt: skip
    assert cycle.action == "kept_back" and cycle.candidate is not None and cycle.candidate.moved is False
    assert site.registry.resolve("JPCP", "Canary").version == canary_before
    assert cycle.candidate.version in [v.version for v in site.registry.list_versions("JPCP")]
    assert "loop.candidate_kept_back" in [t for t, _ in events_of(site, "JPCP")]


def test_a_cancelled_canary_run_puts_its_split_back_from_its_hook(loop_env: Site) -> None:
    from types import SimpleNamespace

    from examlops.bootstrap.loop import closed_loop
    from examlops.flows.canary import _end_after
    from examlops.loop.state import Phase

    with closed_loop(Settings()) as parts:
        before = parts.traffic.get("AC")
        parts.store.claim("AC", "run-x", Phase.CANARY, parts.clock(), 120.0, restore=before, run="flow run x")
        parts.traffic.set("AC", {"Production": 90, "Canary": 10})
        run = SimpleNamespace(parameters={"model": "ac", "owner": "run-x"}, id="other", name="brave-fox")
        _end_after(None, run, SimpleNamespace(type=SimpleNamespace(value="CANCELLED")))
        assert parts.traffic.get("AC") == before
    record = loop_record(loop_env, "AC")
    assert record.phase.value == "aborted" and "brave-fox ended cancelled" in record.note
