"""The serving process for real: uvicorn on a free port, models from a real MLflow store."""

from __future__ import annotations

import asyncio
import json
import math
import shutil
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import cloudpickle
import httpx
import numpy as np
import pytest
from typer.testing import CliRunner

from examlops.api.schemas import ErrorReply
from examlops.cli.main import app as exa
from examlops.core.settings import Settings
from examlops.registry.catalog import load_catalog
from examlops.registry.demo import seed_demo
from tests.integration import sleepy
from tests.integration.servers import ServingProcess
from tests.unit.api.test_ingress import RAW_REFUSALS

pytestmark = [
    pytest.mark.integration,
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::UserWarning"),
    pytest.mark.filterwarnings("ignore::FutureWarning"),
]

AUDIT_DB = 13
"""A Redis database of serving's audit trail on the session's redis-server (tests flush database 0)."""
SLOW_YAML = """name: SLOW
seanerbus_uuid: 00000000-0000-4000-8000-000000000001
default_alias: Production
input_schema:
  embedding: {type: float_array, length: 384}
  node_count: {type: integer, minimum: 1}
tasks: [test.slow]
"""


def register_slow_model(settings: Settings) -> None:
    """A real MLflow version whose predict sleeps a minute, serialised by value."""
    import mlflow
    import mlflow.sklearn

    cloudpickle.register_pickle_by_value(sleepy)
    mlflow.set_tracking_uri(settings.mlflow_tracking_uri)
    client = mlflow.MlflowClient(settings.mlflow_tracking_uri)
    artifacts = settings.mlflow_artifact_root / "tests"
    experiment_id = client.create_experiment("examlops-tests", artifact_location=artifacts.as_uri())
    model = sleepy.SleepyRegressor(60.0).fit(np.zeros((2, 385)), np.zeros(2))
    with mlflow.start_run(experiment_id=experiment_id):
        info = mlflow.sklearn.log_model(
            model,
            name="model",
            serialization_format="cloudpickle",
            pip_requirements=["scikit-learn"],
            registered_model_name="SLOW",
        )
    client.set_registered_model_alias("SLOW", "Production", str(info.registered_model_version))


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, redis_server: str) -> Iterator[ServingProcess]:
    home = tmp_path_factory.mktemp("serving")
    settings = Settings(home=home)
    seed_demo(settings, load_catalog(settings.catalog_path))
    catalog_dir = home / "catalog"
    shutil.copytree(settings.catalog_path, catalog_dir)
    (catalog_dir / "slow.yaml").write_text(SLOW_YAML)
    register_slow_model(settings)
    proc = ServingProcess(
        home,
        env={
            "EXAMLOPS_CATALOG_DIR": str(catalog_dir),
            "EXAMLOPS_REDIS__URL": f"{redis_server.rsplit('/', 1)[0]}/{AUDIT_DB}",  # a split needs its audit event
            "EXAMLOPS_PREDICT__WORKERS": "2",
            "EXAMLOPS_PREDICT__TIMEOUT_S": "4",  # SLOW sleeps 60 s; a first predict in a fresh worker under CI load
            # took more than 1.5 s once
        },
    )
    try:
        proc.wait_ready()
        yield proc
    finally:
        code = proc.stop()
        assert code == 0, proc.log_tail()


def embedding(seed: int = 0) -> list[float]:
    return [float(v) for v in np.random.default_rng(seed).normal(0, 0.05, 384)]


def infer(server: ServingProcess, **body: Any) -> httpx.Response:
    payload: dict[str, Any] = {"model": "JPCP", "embedding": embedding(), "node_count": 12}
    payload.update(body)
    return httpx.post(f"{server.url}/infer-pipeline/infer", json=payload, timeout=30, headers=server.auth)


def test_a_reply_names_the_model_alias_version_and_run(server: ServingProcess) -> None:
    reply = infer(server, job_id="job-1")
    assert reply.status_code == 200, reply.text
    data = reply.json()
    assert (data["model"], data["alias"], data["version"], data["job_id"]) == ("JPCP", "Production", "1", "job-1")
    assert data["run_id"] and data["error"] is None
    assert math.isfinite(data["prediction"])


def test_the_hot_set_lists_every_alias_that_exists(server: ServingProcess) -> None:
    models = httpx.get(f"{server.url}/v1/models", headers=server.auth).json()
    loaded = {(m["model"], m["alias"]): m["version"] for m in models if m["state"] == "ready"}
    for name in ("JPCP", "CRCP", "AC"):
        assert loaded[(name, "Production")] == "1"
        assert loaded[(name, "Canary")] == "2"


@pytest.mark.parametrize(("field", "raw"), RAW_REFUSALS)
def test_bad_payloads_are_refused_with_422_over_real_http(server: ServingProcess, field: str, raw: str) -> None:
    reply = httpx.post(
        f"{server.url}/infer-pipeline/infer", content=raw, headers={"content-type": "application/json", **server.auth}
    )
    assert reply.status_code == 422, reply.text
    assert reply.json()["prediction"] == 0.0


@pytest.mark.parametrize("length", [0, 383, 385])
def test_an_embedding_of_the_wrong_length_is_a_422_naming_the_embedding(server: ServingProcess, length: int) -> None:
    reply = infer(server, embedding=[0.1] * length)
    assert reply.status_code == 422
    assert reply.json()["field"] == "embedding"
    assert reply.json()["inference_failed"] is False


def test_a_body_over_one_mebibyte_is_a_413(server: ServingProcess) -> None:
    reply = httpx.post(
        f"{server.url}/infer-pipeline/infer",
        content=b"[" + b"0.5," * 400_000 + b"0.5]",
        headers={"content-type": "application/json", **server.auth},
    )
    assert reply.status_code == 413


@pytest.mark.parametrize(
    "body",
    [{"model": "NOPE"}, {"alias": "Nightly"}, {"version": 99}],
)
def test_unknown_models_aliases_and_versions_are_404(server: ServingProcess, body: dict[str, Any]) -> None:
    reply = infer(server, **body)
    assert reply.status_code == 404, reply.text
    assert reply.json()["prediction"] == 0.0


ERROR_KEYS = set(ErrorReply.model_fields)


@pytest.mark.parametrize(
    ("field", "body"),
    [
        ("version", {"version": 9223372036854775808}),  # was a 500 naming SQLite's INTEGER
        ("version", {"version": 2**31}),
        ("version", {"version": 0}),
        ("node_count", {"node_count": 2**70}),  # was served
        ("node_count", {"node_count": 1_000_001}),  # over the catalog's maximum
        ("embedding", {"embedding": [0.01] * 383 + [10.5]}),  # a value over the catalog's maximum
        ("embedding", {"embedding": [-10.5] + [0.01] * 383}),
    ],
)
def test_numbers_outside_what_the_model_and_registry_accept_are_a_422_naming_the_field(
    server: ServingProcess, field: str, body: dict[str, Any]
) -> None:
    reply = infer(server, **body)
    assert reply.status_code == 422, reply.text
    data = reply.json()
    assert set(data) == ERROR_KEYS
    assert (data["field"], data["code"], data["inference_failed"]) == (field, "invalid_input", False)
    assert "sqlite" not in reply.text.lower()


def test_the_catalog_maximum_itself_is_served(server: ServingProcess) -> None:
    reply = infer(server, node_count=1_000_000, embedding=[10.0] + [0.01] * 383)
    assert reply.status_code == 200, reply.text


def test_a_long_model_name_is_echoed_as_a_short_prefix_only(server: ServingProcess) -> None:
    for name in ("m" * 4000, "m" * 64_000):
        reply = httpx.post(
            f"{server.url}/v1/models/{name}/predict",
            json={"embedding": embedding(), "node_count": 1},
            headers=server.auth,
        )
        assert reply.status_code == 404, reply.text[:300]
        assert set(reply.json()) == ERROR_KEYS
        assert "m" * 65 not in reply.text
        assert len(reply.content) < 512


@pytest.mark.parametrize(
    ("method", "path", "status", "code"),
    [
        ("GET", "/infer-pipeline/infer", 405, "method_not_allowed"),
        ("DELETE", "/v1/models/JPCP/predict", 405, "method_not_allowed"),
        ("GET", "/no/such/route", 404, "not_found"),
        ("PUT", "/v1/traffic/JPCP", 422, "invalid_input"),
    ],
)
def test_framework_errors_answer_with_our_error_body(
    server: ServingProcess, method: str, path: str, status: int, code: str
) -> None:
    body = {"Production": "x"} if method == "PUT" else None
    reply = httpx.request(method, f"{server.url}{path}", json=body, headers=server.auth)
    assert reply.status_code == status
    assert set(reply.json()) == ERROR_KEYS
    assert reply.json()["code"] == code


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded", None])
def test_a_body_that_is_not_json_is_a_415(server: ServingProcess, content_type: str | None) -> None:
    raw = json.dumps({"model": "JPCP", "embedding": embedding(), "node_count": 12})
    headers = {"content-type": content_type} if content_type else {}
    reply = httpx.post(f"{server.url}/infer-pipeline/infer", content=raw, headers=headers)  # no type of its own
    assert reply.status_code == 415, reply.text
    assert set(reply.json()) == ERROR_KEYS
    assert reply.json()["code"] == "unsupported_media_type"


def test_a_json_media_type_with_parameters_or_a_json_suffix_is_accepted(server: ServingProcess) -> None:
    raw = json.dumps({"model": "JPCP", "embedding": embedding(), "node_count": 12})
    for content_type in ("application/json; charset=utf-8", "application/vnd.examlops+json", "Application/JSON"):
        headers = {"content-type": content_type, **server.auth}
        reply = httpx.post(f"{server.url}/infer-pipeline/infer", content=raw, headers=headers)
        assert reply.status_code == 200, (content_type, reply.text)


def test_names_and_aliases_match_case_insensitively(server: ServingProcess) -> None:
    reply = infer(server, model="jpcp", alias="CANARY")
    assert reply.status_code == 200, reply.text
    assert (reply.json()["model"], reply.json()["alias"], reply.json()["version"]) == ("JPCP", "Canary", "2")


def test_a_pinned_version_is_served_by_that_version(server: ServingProcess) -> None:
    reply = infer(server, model="crcp", version=2)
    assert reply.status_code == 200, reply.text
    assert reply.json()["version"] == "2"


def test_a_split_naming_a_missing_alias_or_not_summing_to_100_is_refused(server: ServingProcess) -> None:
    assert (
        httpx.put(
            f"{server.url}/v1/traffic/AC", json={"Production": 50, "Nightly": 50}, headers=server.auth
        ).status_code
        == 422
    )
    assert (
        httpx.put(f"{server.url}/v1/traffic/AC", json={"Production": 50, "Canary": 40}, headers=server.auth).status_code
        == 422
    )
    assert httpx.get(f"{server.url}/v1/traffic/AC", headers=server.auth).json()["weights"] == {}


async def _send_many(url: str, count: int, concurrency: int, auth: dict[str, str]) -> Counter[str]:
    seen: Counter[str] = Counter()
    limit = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(timeout=30, headers=auth) as client:

        async def one(i: int) -> None:
            async with limit:
                reply = await client.post(
                    f"{url}/infer-pipeline/infer", json={"model": "ac", "embedding": embedding(i % 7), "node_count": 3}
                )
                data = reply.json()
                seen[data["alias"] if reply.status_code == 200 else f"error {reply.status_code}"] += 1

        await asyncio.gather(*(one(i) for i in range(count)))
    return seen


def test_a_split_sends_its_share_within_binomial_bounds(server: ServingProcess) -> None:
    put = httpx.put(f"{server.url}/v1/traffic/ac", json={"production": 70, "canary": 30}, headers=server.auth)
    assert put.status_code == 200, put.text
    assert put.json()["weights"] == {"Production": 70, "Canary": 30}
    try:
        n = 2000
        seen = asyncio.run(_send_many(server.url, n, 32, server.auth))
    finally:
        httpx.put(f"{server.url}/v1/traffic/AC", json={}, headers=server.auth)
    assert set(seen) == {"Production", "Canary"}, seen
    bound = 4.5 * math.sqrt(n * 0.3 * 0.7)
    assert abs(seen["Canary"] - 0.3 * n) < bound, seen


def test_the_split_applies_to_the_default_alias_and_other_aliases_are_pinned(server: ServingProcess) -> None:
    assert (
        httpx.put(
            f"{server.url}/v1/traffic/JPCP", json={"Production": 100, "Canary": 0}, headers=server.auth
        ).status_code
        == 200
    )
    try:
        assert infer(server, alias="Canary").json()["alias"] == "Canary"
        assert infer(server, alias="canary").json()["alias"] == "Canary"
        assert infer(server).json()["alias"] == "Production"
        assert infer(server, alias="production").json()["alias"] == "Production"
    finally:
        httpx.put(f"{server.url}/v1/traffic/JPCP", json={}, headers=server.auth)


def test_a_model_slower_than_the_limit_gets_504_and_the_next_request_is_served(server: ServingProcess) -> None:
    slow = infer(server, model="SLOW")
    assert slow.status_code == 504, slow.text
    assert slow.json()["inference_failed"] is True
    assert slow.json()["prediction"] == 0.0
    # Both workers are free again: two slow calls in a row would otherwise starve these.
    assert infer(server, model="SLOW").status_code == 504
    for _ in range(3):
        assert infer(server).status_code == 200


def test_metrics_count_requests_by_model_alias_and_outcome(server: ServingProcess) -> None:
    infer(server)
    infer(server, embedding=[0.1])
    text = httpx.get(f"{server.url}/metrics").text
    assert 'examlops_requests_total{alias="Production",model="JPCP",outcome="ok"}' in text
    assert "examlops_request_latency_seconds_bucket" in text
    assert "examlops_batch_size_bucket" in text
    assert "examlops_requests_in_flight" in text


def test_no_file_is_written_outside_the_state_folder(server: ServingProcess) -> None:
    assert not Path("mlflow.db").exists()
    assert not Path("mlruns").exists()


def test_reload_on_request_follows_a_moved_alias_and_reports_it(server: ServingProcess) -> None:
    import mlflow

    client = mlflow.MlflowClient(Settings(home=server.home).mlflow_tracking_uri)
    client.set_registered_model_alias("CRCP", "Production", "2")
    try:
        reply = httpx.post(f"{server.url}/admin/reload", json={"model": "crcp"}, timeout=60, headers=server.auth)
        assert reply.status_code == 200, reply.text
        changes = reply.json()["changes"]
        assert [(c["alias"], c["old_version"], c["new_version"], c["outcome"]) for c in changes] == [
            ("Production", "1", "2", "swapped")
        ]
        assert infer(server, model="CRCP").json()["version"] == "2"
        assert (
            httpx.post(f"{server.url}/admin/reload", json={}, timeout=60, headers=server.auth).json()["changes"] == []
        )
    finally:
        client.set_registered_model_alias("CRCP", "Production", "1")
        httpx.post(f"{server.url}/admin/reload", json={"model": "CRCP"}, timeout=60, headers=server.auth)
    assert infer(server, model="CRCP").json()["version"] == "1"


def test_the_cli_checks_predicts_and_sets_traffic_against_a_real_server(server: ServingProcess, tmp_path: Path) -> None:
    runner = CliRunner(env={"EXAMLOPS_TOKEN": server.token})
    check = runner.invoke(exa, ["serve", "check", "--url", server.url, "--json"])
    assert check.exit_code == 0, check.output
    assert json.loads(check.stdout)["ready"] is True

    emb = tmp_path / "embedding.json"
    emb.write_text(json.dumps(embedding(3)))
    predicted = runner.invoke(
        exa,
        [
            "predict",
            "jpcp",
            "--embedding-file",
            str(emb),
            "--node-count",
            "4",
            "--alias",
            "canary",
            "--url",
            server.url,
            "--json",
        ],
    )
    assert predicted.exit_code == 0, predicted.output
    assert json.loads(predicted.stdout)["version"] == "2"

    wrong = tmp_path / "short.json"
    wrong.write_text("[1, 2, 3]")
    refused = runner.invoke(
        exa, ["predict", "JPCP", "--embedding-file", str(wrong), "--node-count", "4", "--url", server.url]
    )
    assert refused.exit_code == 2
    assert "embedding" in refused.output

    bad_split = runner.invoke(
        exa, ["serve", "traffic", "CRCP", "--production", "90", "--canary", "20", "--url", server.url]
    )
    assert bad_split.exit_code == 2
    set_split = runner.invoke(
        exa, ["serve", "traffic", "CRCP", "--production", "90", "--canary", "10", "--url", server.url, "--json"]
    )
    assert set_split.exit_code == 0, set_split.output
    try:
        shown = runner.invoke(exa, ["serve", "traffic", "crcp", "--url", server.url, "--json"])
        assert json.loads(shown.stdout)["weights"] == {"Production": 90, "Canary": 10}
    finally:
        runner.invoke(exa, ["serve", "traffic", "CRCP", "--clear", "--url", server.url])

    infer_check = runner.invoke(exa, ["serve", "infer-check", "--url", server.url, "--json"])
    assert infer_check.exit_code == 0, infer_check.output
    assert json.loads(infer_check.stdout)["error"] is None


def test_a_model_that_raises_is_a_500_marked_inference_failed(server: ServingProcess) -> None:
    # The demo's Staging version fails on purpose (the log of negative embedding values is NaN).
    reply = infer(server, alias="staging", job_id="job-raise")
    assert reply.status_code == 500, reply.text
    data = reply.json()
    assert (data["inference_failed"], data["prediction"], data["code"], data["job_id"]) == (
        True,
        0.0,
        "inference_failed",
        "job-raise",
    )
    assert infer(server).status_code == 200  # the worker that saw it keeps serving
