"""The control-plane flows under one Prefect test harness, against real Redis, MLflow (SQLite) and serving.

One seeded MLflow store and one harness for the module; every flow reads its
settings from ``EXAMLOPS_*`` like the served deployments do, pointed at a
private state folder and the session's redis-server.
"""

from __future__ import annotations

import json
import os
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import redis

from examlops.bootstrap import upgrade_database
from examlops.core.settings import Settings
from examlops.monitoring.retrain import (
    DEFAULT_DEPLOYMENT,
    OutboxDelivery,
    PrefectRetrainRequester,
    RedisOutbox,
    RetrainRequest,
)
from examlops.registry.catalog import load_catalog
from examlops.registry.demo import seed_demo
from examlops.registry.mlflow_registry import MlflowRegistry
from examlops.registry.synthetic import features, make_dataset
from tests.integration.servers import ServingProcess

pytestmark = [
    pytest.mark.integration,
    # Prefect's and Evidently's own deprecations, not ours.
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::FutureWarning"),
    pytest.mark.filterwarnings("ignore::UserWarning:evidently.*"),
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
]


@dataclass(frozen=True)
class Plane:
    home: Path
    env: dict[str, str]
    settings: Settings
    registry: MlflowRegistry
    redis: redis.Redis


@pytest.fixture(scope="module")
def plane(tmp_path_factory: pytest.TempPathFactory, redis_server: str) -> Iterator[Plane]:
    """A seeded state folder and one prefect_test_harness (15-30 s) whose files stay in the temp folder."""
    root = tmp_path_factory.mktemp("flows")
    home = root / "state"
    home.mkdir()
    env = {"EXAMLOPS_HOME": str(home), "EXAMLOPS_REDIS__URL": redis_server, "EXAMLOPS_LOOP__AUTO_CANARY": "false"}
    settings = Settings(home=home, redis={"url": redis_server})
    seed_demo(settings, load_catalog(settings.catalog_path))
    upgrade_database(settings)  # as `exa up` does first
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PREFECT_HOME", str(settings.prefect_home))
        mp.setenv("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
        mp.setenv("MLFLOW_DISABLE_TELEMETRY", "true")
        mp.chdir(root)  # anything a library drops in the working directory lands in the temp folder
        from prefect.testing.utilities import prefect_test_harness

        with prefect_test_harness(server_startup_timeout=90):
            client = redis.Redis.from_url(redis_server, decode_responses=True)
            client.flushdb()
            yield Plane(home, env, settings, MlflowRegistry(settings.mlflow_tracking_uri, home / "cache"), client)
            client.close()


@pytest.fixture
def flow_env(plane: Plane, monkeypatch: pytest.MonkeyPatch) -> Plane:
    """The flows build their own Settings from the environment, as the served deployments do."""
    for name, value in plane.env.items():
        monkeypatch.setenv(name, value)
    return plane


def add_snapshots(plane: Plane, model: str, rows: int, *, seed: int, shift: float) -> None:
    """Snapshots of Production-version predictions on synthetic traffic, as the bridge writes them."""
    from examlops.monitoring.snapshots import MODELS, snapshot_of
    from examlops.registry.loader import load_sklearn_model

    ref = plane.registry.resolve(model, "Production")
    predictor = load_sklearn_model(plane.registry.fetch(ref))
    emb, nodes, _ = make_dataset(rows, dim=384, seed=seed, shift=shift)
    predictions = predictor.predict(features(emb, nodes))
    pipe = plane.redis.pipeline()
    for i in range(rows):
        reply = {
            "alias": "Production",
            "version": ref.version,
            "run_id": ref.run_id,
            "prediction": float(predictions[i]),
        }
        snapshot = snapshot_of(
            model=model, reply=reply, status=200, embedding=list(emb[i]), node_count=int(nodes[i]),
            job_id=f"{model}-{seed}-{i}", user_id="test", ts=1_700_000_000.0 + i,
        )  # fmt: skip
        side = snapshot.side_write()
        pipe.xadd(side.stream, dict(side.fields))
        pipe.sadd(MODELS, side.member)
    pipe.execute()


def drift_rows(plane: Plane, model: str) -> list[Any]:
    from examlops.bootstrap import sql_engine
    from examlops.monitoring.drift_store import SqlDriftStore

    return SqlDriftStore(sql_engine(plane.settings)).latest("prediction", model)


def test_drift_report_flow_detects_shifted_traffic_and_not_same_distribution(flow_env: Plane) -> None:
    from examlops.flows.drift_report import drift_report_flow

    add_snapshots(flow_env, "JPCP", 600, seed=zlib.crc32(b"same"), shift=0.0)
    [same] = drift_report_flow(models=["jpcp"])
    assert same["reported"] and same["prediction_drift"] is False and same["input_drift"] is False

    add_snapshots(flow_env, "JPCP", 600, seed=zlib.crc32(b"moved"), shift=1.0)
    [moved] = drift_report_flow(models=["JPCP"])
    assert moved["reported"] and moved["prediction_drift"] is True and moved["input_drift"] is True
    assert moved["prediction_score"] < 0.05 and Path(moved["report"]).is_file()
    assert Path(moved["report"]).is_relative_to(flow_env.home / "drift" / "JPCP")

    [row] = drift_rows(flow_env, "JPCP")
    assert row.drifted and row.method == "ks" and row.threshold == 0.05 and row.current_rows == 600


def test_the_drift_checkpoint_means_a_window_is_never_reported_twice(flow_env: Plane) -> None:
    from examlops.flows.drift_report import drift_report_flow
    from examlops.monitoring.snapshots import SnapshotStream

    add_snapshots(flow_env, "CRCP", 300, seed=11, shift=0.0)
    [first] = drift_report_flow(models=["CRCP"])
    assert first["reported"] and first["rows"] == 300
    checkpoint = SnapshotStream(flow_env.redis).checkpoint("CRCP")
    assert checkpoint is not None

    [again] = drift_report_flow(models=["CRCP"])
    assert again["reported"] is False
    assert SnapshotStream(flow_env.redis).checkpoint("CRCP") == checkpoint
    assert len(drift_rows(flow_env, "CRCP")) == 1  # still the first report's row


def test_drift_report_publishes_a_table_artifact(flow_env: Plane) -> None:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    from examlops.flows.drift_report import drift_report_flow

    drift_report_flow(models=["AC"])
    with get_client(sync_client=True) as client:
        artifacts = client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=["drift-report"])))
    assert artifacts and artifacts[0].type == "table"


def test_retrain_flow_registers_a_new_version_moves_canary_and_audits_it(flow_env: Plane) -> None:
    from examlops.flows.retrain import retrain_flow
    from examlops.monitoring.audit import tail

    before = [v.version for v in flow_env.registry.list_versions("CRCP")]
    summary = retrain_flow(model="CRCP", reason="test", seed=7, source="operator")
    assert summary["action"] == "on_canary"  # the analysis is not started here (auto_canary off)
    result = summary["retrain"]
    assert result["version"] not in before and result["alias"] == "Canary" and result["replaced_version"] == "2"
    assert flow_env.registry.resolve("CRCP", "Canary").version == result["version"]
    assert flow_env.registry.resolve("CRCP", "Production").version == "1"
    run = flow_env.registry.client.get_run(result["run_id"])
    assert run.data.metrics["holdout_rmse"] == pytest.approx(result["candidate_rmse"])
    assert "production_holdout_rmse" in run.data.metrics and run.data.params["data_source"] == "synthetic"
    [event] = [e for e in tail(flow_env.redis, 20) if e.type == "model.retrained"]
    assert event.subject == "CRCP"
    moves = [(e.type, json.loads(e.data)) for e in tail(flow_env.redis, 20) if e.type.startswith("alias.")]
    assert [t for t, _ in moves] == ["alias.move_intended", "alias.moved"]  # Canary never moves without a trail
    assert all(d["alias"] == "Canary" and d["by"] == "retrain" for _, d in moves)
    assert json.loads(event.data)["actor"] == "system:retrain"


def test_retrain_flow_refuses_a_non_candidate_alias_before_the_loop_records_anything(flow_env: Plane) -> None:
    from examlops.bootstrap.loop import loop_store
    from examlops.core.errors import InvalidInput
    from examlops.flows.retrain import retrain_flow

    versions = [v.version for v in flow_env.registry.list_versions("AC")]
    with loop_store(flow_env.settings) as store:
        before = store.get("AC")
    with pytest.raises(InvalidInput, match="candidate alias must be one of Canary, Staging"):
        retrain_flow(model="AC", candidate_alias="Production", source="operator")
    with loop_store(flow_env.settings) as store:
        assert store.get("AC") == before  # refused input is no loop outcome
    assert [v.version for v in flow_env.registry.list_versions("AC")] == versions


def test_promote_flow_moves_the_alias_and_a_running_server_reloads(flow_env: Plane) -> None:
    import httpx

    from examlops.flows.promote import promote_flow

    server = ServingProcess(
        flow_env.home, env={"EXAMLOPS_PREDICT__WORKERS": "1", "EXAMLOPS_HOTSET__RELOAD_POLL_S": "0"}
    )
    try:
        server.wait_ready()
        result = promote_flow(model="ac", alias="Production", version=2, instances=[server.url], timeout_s=60)
        assert (result["old_version"], result["new_version"]) == ("1", "2")
        assert result["instances"] == (server.url,) or result["instances"] == [server.url]
        rows = httpx.get(f"{server.url}/v1/models", timeout=5, headers=server.auth).json()
        assert {(r["model"], r["alias"], r["version"]) for r in rows} >= {("AC", "Production", "2")}
        assert flow_env.registry.resolve("AC", "Production").version == "2"
    finally:
        server.stop()
    from examlops.monitoring.audit import tail

    moved = [e for e in tail(flow_env.redis, 20) if e.type == "alias.moved"]
    assert moved and moved[-1].subject == "AC"
    assert json.loads(moved[-1].data)["actor"] == "system:promote"  # nobody named: the flow's own name


def test_the_served_deployments_come_from_prefect_yaml(plane: Plane) -> None:
    from examlops.flows.deployments import default_path, load_deployments

    deployments = {d.name: d for d in load_deployments(default_path())}
    assert set(deployments) == {"drift-report", "retrain", "canary-analysis", "promote", "retention"}
    [schedule] = deployments["drift-report"].schedules
    assert schedule.schedule.cron == "*/15 * * * *"  # type: ignore[union-attr]
    assert deployments["retrain"].entrypoint == "examlops.flows.retrain.retrain_flow"
    assert np.isclose(deployments["drift-report"].parameters["min_rows"], 30)


def test_nothing_is_written_outside_the_state_folder(plane: Plane) -> None:
    assert not (Path(os.getcwd()) / "mlflow.db").exists() and not (Path(os.getcwd()) / "mlruns").exists()


def test_a_retrain_request_delivered_twice_makes_exactly_one_flow_run(plane: Plane) -> None:
    """The bridge's real path (the Redis outbox, ``OutboxDelivery``, ``PrefectRetrainRequester``) against the
    harness: the retrain deployment of prefect.yaml is registered but not served, so its runs stay scheduled
    and can be counted."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId
    from prefect.settings import PREFECT_API_URL

    from examlops.flows.deployments import default_path, load_deployments

    [deployment] = [d for d in load_deployments(default_path()) if d.name == "retrain"]
    assert f"{deployment.flow_name}/{deployment.name}" == DEFAULT_DEPLOYMENT
    deployment_id = deployment.apply()
    api_url = PREFECT_API_URL.value()
    assert api_url, "the harness set no API URL"
    outbox = RedisOutbox(plane.redis)
    delivery = OutboxDelivery(outbox, PrefectRetrainRequester(str(api_url)))
    key = "retrain:crcp:1700000000"
    request = RetrainRequest("CRCP", "failure rate 0.6 over 50", key, 1_700_000_000.0)

    run_ids = []
    for _ in range(2):  # queued again after its delivery, as a second bridge or a replayed outbox would
        assert outbox.add(request)
        assert delivery.deliver_due() == 1
        run_ids.append(outbox.last()["crcp"]["flow_run_id"])
    assert run_ids[0] is not None and run_ids[0] == run_ids[1]

    with get_client(sync_client=True) as prefect:
        runs = prefect.read_flow_runs(deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[deployment_id])))
    assert [(str(run.id), run.idempotency_key) for run in runs] == [(run_ids[0], key)]
    assert (runs[0].parameters["model"], runs[0].parameters["reason"]) == ("CRCP", "failure rate 0.6 over 50")
    # The closed loop tells the trigger's runs from an operator's, and ignores a request older than its promotion.
    assert runs[0].parameters["source"] == "failure-trigger"
    assert runs[0].parameters["requested_at"] == 1_700_000_000.0


def test_the_retention_flow_archives_the_checkpointed_trail_and_trims_old_snapshots(flow_env: Plane) -> None:
    """Last in the module: it moves the trail that earlier tests read with ``tail`` out of Redis."""
    import time

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    from examlops.bootstrap.control import ControlPlane, audit_access
    from examlops.flows.retention import retention_flow
    from examlops.monitoring.audit import verify
    from examlops.monitoring.snapshots import MODELS, stream_of

    settings = Settings()  # from the environment, as the flow's own
    audit = ControlPlane(settings).audit  # signs every event at once
    for i in range(3):
        audit("traffic.changed", "AC", {"i": i, "by": "retention test"})
    flow_env.redis.xadd(stream_of("AC"), {"s": "[]"}, id=f"{int((time.time() - 3600) * 1000)}-0")
    flow_env.redis.sadd(MODELS, "ac")
    recent = flow_env.redis.xadd(stream_of("AC"), {"s": "[]"})

    result = retention_flow(snapshot_max_age_s=600)
    head = int(flow_env.redis.hget("examlops:audit:head", "seq") or 0)
    assert result["audit"]["archive_last_seq"] == head and flow_env.redis.xlen("examlops:audit:events") == 0
    assert result["snapshots"]["ac"] >= 1
    assert result["verify"]["ok"] and result["verify"]["by"] == "retention flow"  # stored for the dashboard
    assert [entry_id for entry_id, _ in flow_env.redis.xrange(stream_of("AC"))][-1] == recent
    with audit_access(settings) as access:
        report = verify(access.store, access.secret, access.checkpoints, archive=access.archive)
    assert report.ok and report.archived == report.events == head
    with get_client(sync_client=True) as client:
        artifacts = client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=["retention"])))
    assert artifacts and artifacts[0].type == "table"


def test_a_retention_run_after_an_alias_move_the_trail_does_not_hold_stores_a_failing_verify(
    flow_env: Plane,
) -> None:
    """The flow checks the aliases as `exa audit verify` does, so its result never hides what the CLI found."""
    from examlops.bootstrap.control import ControlPlane, audit_access
    from examlops.flows.retention import retention_flow
    from examlops.monitoring.audit import ALIAS_MOVED
    from examlops.monitoring.audit.verified import last_verify

    settings = Settings()
    registry = flow_env.registry
    before = registry.resolve("CRCP", "Production").version
    other = next(v.version for v in registry.list_versions("CRCP") if v.version != before)
    move = {"model": "CRCP", "alias": "Production", "old_version": None, "new_version": before}
    ControlPlane(settings).audit(ALIAS_MOVED, "CRCP", {**move, "from": None, "to": before, "by": "test", "actor": "t"})
    registry.set_alias("CRCP", "Production", other)  # moved outside examlops, as the MLflow UI would
    try:
        result = retention_flow()
    finally:
        registry.set_alias("CRCP", "Production", before)
    assert result["verify"]["ok"] is False and result["verify"]["by"] == "retention flow"
    assert any("CRCP@Production" in problem for problem in result["verify"]["problems"])
    with audit_access(settings) as access:
        stored = last_verify(access.store.redis, access.secret)
    assert stored is not None and not stored.ok and stored.problems == tuple(result["verify"]["problems"])


def test_the_work_pool_form_deploys_with_prefect_deploy_and_a_process_worker_runs_a_flow(
    plane: Plane, tmp_path: Path, redis_server: str
) -> None:
    """The several-machines form of prefect.yaml, as a user runs it: `prefect work-pool create`, `prefect deploy
    --all`, then `prefect worker start --run-once` in another process picks up a run of ``retention/retention``.
    The worker gets a state folder and a Redis database of its own, as a worker on another machine would."""
    import subprocess
    import sys

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.objects import StateType
    from prefect.settings import PREFECT_API_URL

    from examlops.flows.deployments import default_path

    prefect = [str(Path(sys.executable).parent / "prefect"), "--no-prompt"]
    home = tmp_path / "worker-state"
    home.mkdir()
    worker_redis = redis_server.rsplit("/", 1)[0] + "/7"
    upgrade_database(Settings(home=home, redis={"url": worker_redis}))
    env = {k: v for k, v in os.environ.items() if not k.startswith("EXAMLOPS_")}
    env |= {"PREFECT_API_URL": str(PREFECT_API_URL.value()), "EXAMLOPS_HOME": str(home)}
    env |= {"EXAMLOPS_REDIS__URL": worker_redis}

    def prefect_cli(*args: str, timeout: float = 120) -> str:
        done = subprocess.run([*prefect, *args], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=timeout)
        assert done.returncode == 0, f"prefect {' '.join(args)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
        return done.stdout

    prefect_cli("work-pool", "create", "examlops", "--type", "process")
    prefect_cli("deploy", "--all", "--prefect-file", str(default_path()))
    with get_client(sync_client=True) as client:
        deployments = {d.name: d for d in client.read_deployments() if d.work_pool_name == "examlops"}
        assert set(deployments) == {"drift-report", "retrain", "canary-analysis", "promote", "retention"}
        assert deployments["retention"].entrypoint == "examlops.flows.retention:retention_flow"
        assert deployments["retention"].pull_steps in (None, [])
        run = client.create_flow_run_from_deployment(deployments["retention"].id)

    prefect_cli("worker", "start", "--pool", "examlops", "--type", "process", "--run-once", timeout=240)
    with get_client(sync_client=True) as client:
        state = client.read_flow_run(run.id).state
    assert state is not None and state.type == StateType.COMPLETED, state
