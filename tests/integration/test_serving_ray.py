"""The Ray engine passes the default engine's HTTP behaviour tests, plus reload under load and promotion.

One module-scoped `exa serve start` with ``EXAMLOPS_SERVING__ENGINE=ray`` (a local Ray cluster of 2 CPUs,
two replicas per model) serves every test: the tests of ``test_serving_http`` are imported and run here
against it (refusal matrix, split, pinned aliases, reload on request, 504 at the limit, metrics, the CLI),
then the checks only a Ray deployment raises: every replica follows a moved alias with no failed
request, and `exa promote`'s service reaches the instance. Skipped where the ``ray`` extra is absent.
"""

from __future__ import annotations

import asyncio
import os
import pickle
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

pytest.importorskip("ray", reason="the Ray engine needs the ray extra (pip install 'examlops[ray]')")

from examlops.core.errors import ModelLoadError
from examlops.core.settings import Settings
from examlops.promotion.service import promote, rollback
from examlops.registry.catalog import load_catalog
from examlops.registry.demo import seed_demo
from examlops.registry.mlflow_registry import MlflowRegistry
from tests.integration.servers import ServingProcess
from tests.integration.test_serving_http import (  # noqa: F401  # collected here against the Ray server
    AUDIT_DB,
    SLOW_YAML,
    embedding,
    infer,
    register_slow_model,
    test_a_body_over_one_mebibyte_is_a_413,
    test_a_body_that_is_not_json_is_a_415,
    test_a_json_media_type_with_parameters_or_a_json_suffix_is_accepted,
    test_a_long_model_name_is_echoed_as_a_short_prefix_only,
    test_a_model_slower_than_the_limit_gets_504_and_the_next_request_is_served,
    test_a_model_that_raises_is_a_500_marked_inference_failed,
    test_a_pinned_version_is_served_by_that_version,
    test_a_reply_names_the_model_alias_version_and_run,
    test_a_split_naming_a_missing_alias_or_not_summing_to_100_is_refused,
    test_a_split_sends_its_share_within_binomial_bounds,
    test_an_embedding_of_the_wrong_length_is_a_422_naming_the_embedding,
    test_bad_payloads_are_refused_with_422_over_real_http,
    test_framework_errors_answer_with_our_error_body,
    test_metrics_count_requests_by_model_alias_and_outcome,
    test_names_and_aliases_match_case_insensitively,
    test_no_file_is_written_outside_the_state_folder,
    test_numbers_outside_what_the_model_and_registry_accept_are_a_422_naming_the_field,
    test_reload_on_request_follows_a_moved_alias_and_reports_it,
    test_the_catalog_maximum_itself_is_served,
    test_the_cli_checks_predicts_and_sets_traffic_against_a_real_server,
    test_the_hot_set_lists_every_alias_that_exists,
    test_the_split_applies_to_the_default_alias_and_other_aliases_are_pinned,
    test_unknown_models_aliases_and_versions_are_404,
)

pytestmark = [
    pytest.mark.integration,
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::UserWarning"),
    pytest.mark.filterwarnings("ignore::FutureWarning"),
    pytest.mark.timeout(600),
]

REPLICAS = 2
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def server(redis_server: str) -> Iterator[ServingProcess]:
    # Short, not pytest's tmp path (a worker's is longer still): Ray's socket paths live under it.
    home = Path(tempfile.mkdtemp(prefix="exa-ray-"))
    try:
        yield from _serve(home, f"{redis_server.rsplit('/', 1)[0]}/{AUDIT_DB}")
    finally:
        shutil.rmtree(home, ignore_errors=True)


def _serve(home: Path, redis_url: str) -> Iterator[ServingProcess]:
    settings = Settings(home=home)
    seed_demo(settings, load_catalog(settings.catalog_path))
    catalog_dir = home / "catalog"
    shutil.copytree(settings.catalog_path, catalog_dir)
    (catalog_dir / "slow.yaml").write_text(SLOW_YAML)
    register_slow_model(settings)
    proc = ServingProcess(
        home,
        env={
            "EXAMLOPS_SERVING__ENGINE": "ray",
            "EXAMLOPS_REDIS__URL": redis_url,  # a split needs its audit event
            "EXAMLOPS_CATALOG_DIR": str(catalog_dir),
            "EXAMLOPS_PREDICT__WORKERS": "2",
            # The 504 test needs a short predict limit; a loaded CI machine needs a long deploy deadline (a
            # replica's start and load share the 2 CPUs with every other one).
            "EXAMLOPS_PREDICT__TIMEOUT_S": "1.5",
            "EXAMLOPS_RAY__DEPLOY_TIMEOUT_S": "200",
            "EXAMLOPS_RAY__NUM_CPUS": "2",
            "EXAMLOPS_RAY__NUM_REPLICAS": str(REPLICAS),
            "EXAMLOPS_RAY__REPLICA_CPUS": "0.1",
        },
    )
    try:
        proc.wait_ready(timeout_s=300)
        yield proc
    finally:
        code = proc.stop(timeout_s=60)
        assert code == 0, proc.log_tail()


def test_ray_keeps_its_sessions_and_token_under_the_state_folder(server: ServingProcess) -> None:
    ray_dir = server.home / "ray"
    assert any(ray_dir.glob("session_*")), list(ray_dir.iterdir())
    assert (ray_dir / "auth_token").stat().st_mode & 0o077 == 0


def _set_alias(server: ServingProcess, model: str, alias: str, version: str) -> None:
    import mlflow

    mlflow.MlflowClient(Settings(home=server.home).mlflow_tracking_uri).set_registered_model_alias(
        model, alias, version
    )


async def _load_while_flipping(server: ServingProcess, flips: int) -> tuple[list[tuple[int, Any]], list[str]]:
    """8 clients send JPCP requests while Production flips ``flips`` times, each flip followed by a reload."""
    replies: list[tuple[int, Any]] = []
    moved: list[str] = []
    stop = asyncio.Event()
    async with httpx.AsyncClient(base_url=server.url, timeout=30, headers=server.auth) as client:

        async def clientloop(i: int) -> None:
            while not stop.is_set():
                body = {"model": "JPCP", "embedding": embedding(i), "node_count": 12}
                try:
                    reply = await client.post("/infer-pipeline/infer", json=body)
                    replies.append((reply.status_code, reply.json().get("version")))
                except httpx.HTTPError as exc:
                    replies.append((0, type(exc).__name__))

        async def flipper() -> None:
            await asyncio.sleep(0.5)
            for flip in range(flips):
                version = "2" if flip % 2 == 0 else "1"
                await asyncio.to_thread(_set_alias, server, "JPCP", "Production", version)
                reply = await client.post("/admin/reload", json={"model": "JPCP"}, timeout=120)
                assert reply.status_code == 200, reply.text
                assert [c["outcome"] for c in reply.json()["changes"]] == ["swapped"], reply.text
                moved.append(version)
                await asyncio.sleep(0.3)
            await asyncio.sleep(0.5)
            stop.set()

        await asyncio.gather(flipper(), *(clientloop(i) for i in range(8)))
    return replies, moved


def test_a_moved_alias_reloads_every_replica_under_load_and_fails_no_request(server: ServingProcess) -> None:
    try:
        replies, moved = asyncio.run(_load_while_flipping(server, flips=4))
    finally:
        _set_alias(server, "JPCP", "Production", "1")
        httpx.post(f"{server.url}/admin/reload", json={"model": "JPCP"}, timeout=120, headers=server.auth)
    failed = [r for r in replies if r[0] != 200]
    assert not failed, failed[:5]
    assert moved == ["2", "1", "2", "1"]
    assert {version for _, version in replies} == {"1", "2"}
    # After the last reload every replica holds version 1 only: requests spread over both answer with it.
    versions = {infer(server).json()["version"] for _ in range(4 * REPLICAS)}
    assert versions == {"1"}


def test_promotion_reaches_the_ray_served_pipeline_and_rollback_moves_it_back(server: ServingProcess) -> None:
    settings = Settings(home=server.home)
    registry = MlflowRegistry(settings.mlflow_tracking_uri, server.home / "cache")
    urls = [server.url]
    result = promote(
        settings, registry, "ac", "production", version=2, instances=urls, timeout_s=120, token=server.token
    )
    assert (result.old_version, result.new_version, result.instances) == ("1", "2", tuple(urls))
    body = {"model": "AC", "embedding": embedding(), "node_count": 3}
    answer = httpx.post(f"{server.url}/infer-pipeline/infer", json=body, timeout=30, headers=server.auth)
    assert answer.json()["version"] == "2"

    back = rollback(settings, registry, "AC", instances=urls, timeout_s=120, token=server.token)
    assert (back.old_version, back.new_version) == ("2", "1")
    answer = httpx.post(f"{server.url}/infer-pipeline/infer", json=body, timeout=30, headers=server.auth)
    assert answer.json()["version"] == "1"


class Model:
    """What the ingress's own load of a folder returns when a test skips it: a model of no declared width."""

    def predict(self, rows: Any) -> Any:
        return np.zeros(len(rows))


def _model_folder(folder: Path) -> Path:
    """An MLflow-style sklearn folder of a linear model whose prediction is its first column times two."""
    from sklearn.linear_model import LinearRegression

    x = np.random.default_rng(0).normal(size=(8, 3))
    model = LinearRegression().fit(x, x[:, 0] * 2)
    folder.mkdir()
    (folder / "model.pkl").write_bytes(pickle.dumps(model))
    (folder / "MLmodel").write_text(
        "flavors:\n  sklearn:\n    pickled_model: model.pkl\n    serialization_format: pickle\n"
    )
    return folder


def test_a_replica_on_another_node_loads_the_version_through_ray_and_answers(tmp_path: Path) -> None:
    """Two Ray nodes: the head (this driver, the artifact store) has no CPU, so the replica runs on the other.

    The nodes share this machine's disk, so the test stands on ``user_config``: it names a token only, and
    the replica loads from the bytes it fetched through Ray.
    """
    import ray
    from ray import serve
    from ray.cluster_utils import Cluster

    from examlops.serving.ray_deploy import app_name, running_replicas
    from examlops.serving.ray_runtime import RayPredictRuntime

    folder = _model_folder(tmp_path / "M-1")
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
    cluster.add_node(num_cpus=1)
    env = {"PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    ray.init(address=cluster.address, namespace="examlops", runtime_env={"env_vars": env}, log_to_driver=False)
    try:
        serve.start()
        settings = Settings(home=tmp_path, ray={"num_replicas": 1, "replica_cpus": 0.5, "deploy_timeout_s": 90})
        # No load in the driver first: the broken version below reaches the replica, as one that loads in the
        # ingress but not on a replica's node would.
        runtime = RayPredictRuntime(settings, check=lambda location: Model())

        async def load_and_predict() -> list[float]:
            await runtime.load("M/1", str(folder))
            return list(await runtime.predict("M/1", np.array([[1.0, 0.0, 0.0], [3.0, 0.0, 0.0]])))

        async def load_broken_then_predict() -> list[float]:
            (tmp_path / "empty").mkdir()
            before = running_replicas("M")
            # The replica reports the failure; its reason is the refusal's, and the replica keeps running.
            with pytest.raises(ModelLoadError, match=r"M/2 could not be loaded on replica \S+: ModelLoadError"):
                await runtime.load("M/2", str(tmp_path / "empty"))
            assert running_replicas("M") == before
            return list(await runtime.predict("M/1", np.array([[1.0, 0.0, 0.0]])))

        async def scenario() -> tuple[list[float], list[float]]:
            return await load_and_predict(), await load_broken_then_predict()

        good, after_broken = asyncio.run(scenario())
        assert np.allclose(good, [2.0, 6.0])
        assert np.allclose(after_broken, [2.0])  # rolled back: M/1 still answers
        details = serve.status().applications[app_name("M")]
        assert str(details.status).endswith("RUNNING")
        from ray.serve.context import _get_global_client

        config = _get_global_client().get_serve_details()
        user_config = config["applications"][app_name("M")]["deployments"]["replica"]["deployment_config"]
        tokens = user_config["user_config"]["versions"]
        replicas = config["applications"][app_name("M")]["deployments"]["replica"]["replicas"]
        nodes = {r["node_id"] for r in replicas}
        assert nodes and ray.get_runtime_context().get_node_id() not in nodes  # not the head's
        assert list(tokens) == ["M/1"] and str(tmp_path) not in str(tokens) and "/" not in tokens["M/1"]
    finally:
        serve.shutdown()
        ray.shutdown()
        cluster.shutdown()


def test_after_a_504_ray_replaces_the_stuck_replica_and_the_same_model_answers_again(server: ServingProcess) -> None:
    """A timed-out prediction leaves its replica failing its health check: Ray restarts it with the same
    versions, and the model's deployment answers again (here through a fast version of the same model)."""
    import mlflow
    import mlflow.sklearn

    from tests.integration import sleepy

    assert infer(server, model="SLOW").status_code == 504
    settings = Settings(home=server.home)
    mlflow.set_tracking_uri(settings.mlflow_tracking_uri)
    experiment = mlflow.MlflowClient(settings.mlflow_tracking_uri).get_experiment_by_name("examlops-tests")
    assert experiment is not None
    with mlflow.start_run(experiment_id=experiment.experiment_id):
        info = mlflow.sklearn.log_model(
            sleepy.SleepyRegressor(0.0).fit(np.zeros((2, 385)), np.zeros(2)),
            name="model",
            serialization_format="cloudpickle",
            pip_requirements=["scikit-learn"],
            registered_model_name="SLOW",
        )
    version = str(info.registered_model_version)
    replies = [infer(server, model="SLOW", version=int(version)) for _ in range(2 * REPLICAS)]
    assert [r.status_code for r in replies] == [200] * (2 * REPLICAS), replies[-1].text
    assert {r.json()["version"] for r in replies} == {version}


def _broken_version(server: ServingProcess, model: str) -> str:
    """A new registered version of ``model`` whose serialised model is garbage: no process can load it."""
    import mlflow
    import mlflow.sklearn
    from sklearn.linear_model import LinearRegression

    settings = Settings(home=server.home)
    mlflow.set_tracking_uri(settings.mlflow_tracking_uri)
    experiment = mlflow.MlflowClient(settings.mlflow_tracking_uri).get_experiment_by_name("examlops-tests")
    assert experiment is not None
    with mlflow.start_run(experiment_id=experiment.experiment_id) as run:
        info = mlflow.sklearn.log_model(
            LinearRegression().fit(np.zeros((2, 385)), np.zeros(2)),
            name="model",
            pip_requirements=["scikit-learn"],
            registered_model_name=model,
        )
    marks = [m for m in (getattr(info, "model_id", None), run.info.run_id) if m]
    files = [p for p in settings.mlflow_artifact_root.rglob("model.*") if any(m in str(p) for m in marks)]
    assert files, marks  # model.skops or model.pkl, by MLflow's default format
    for path in files:
        path.write_bytes(b"not a model")
    return str(info.registered_model_version)


async def _reload_under_load(server: ServingProcess, model: str) -> tuple[list[int], dict[str, Any]]:
    """4 clients send ``model`` requests while it is reloaded once; their statuses and the reload's reply."""
    statuses: list[int] = []
    stop = asyncio.Event()
    async with httpx.AsyncClient(base_url=server.url, timeout=30, headers=server.auth) as client:

        async def clientloop(i: int) -> None:
            while not stop.is_set():
                body = {"model": model, "embedding": embedding(i), "node_count": 12}
                statuses.append((await client.post("/infer-pipeline/infer", json=body)).status_code)

        async def reload() -> dict[str, Any]:
            await asyncio.sleep(0.5)
            try:
                reply = await client.post("/admin/reload", json={"model": model}, timeout=120)
                assert reply.status_code == 200, reply.text
                return dict(reply.json())
            finally:
                await asyncio.sleep(0.5)
                stop.set()

        answer, *_ = await asyncio.gather(reload(), *(clientloop(i) for i in range(4)))
    return statuses, answer


def test_a_version_that_cannot_load_is_refused_with_its_reason_and_no_request_fails(server: ServingProcess) -> None:
    version = _broken_version(server, "JPCP")
    _set_alias(server, "JPCP", "Canary", version)
    try:
        statuses, answer = asyncio.run(_reload_under_load(server, "JPCP"))
    finally:
        _set_alias(server, "JPCP", "Canary", "2")
        httpx.post(f"{server.url}/admin/reload", json={"model": "JPCP"}, timeout=120, headers=server.auth)
    assert statuses and set(statuses) == {200}
    [change] = [c for c in answer["changes"] if c["alias"] == "Canary"]
    assert change["outcome"] == "refused", answer
    assert f"version {version} refused" in change["reason"] and "could not be loaded" in change["reason"], change
    assert infer(server).status_code == 200
