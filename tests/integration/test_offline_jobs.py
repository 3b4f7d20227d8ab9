"""Offline jobs in a real serving process (uvicorn, MLflow, SQLite): submit -> done -> results, over HTTP and
the CLI, who sees which job, the job's trace, and a restart of serving in the middle of a job that resumes
without answering any instance twice."""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from typer.testing import CliRunner

from examlops.bootstrap.sql import sql_engine
from examlops.cli.main import app as exa
from examlops.core.settings import Settings
from examlops.identity import Identity, Role
from examlops.identity.model import IdentityKey
from examlops.identity.sql import SqlIdentityStore
from examlops.identity.tokens import new_token
from examlops.registry.catalog import load_catalog
from examlops.registry.demo import seed_demo
from tests.integration.servers import ServingProcess

pytestmark = [
    pytest.mark.integration,
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::UserWarning"),
    pytest.mark.filterwarnings("ignore::FutureWarning"),
]

TASK = "pavement.distress.jpcp"
ENV = {
    "EXAMLOPS_PREDICT__WORKERS": "1",
    "EXAMLOPS_HOTSET__RELOAD_POLL_S": "0",
    "EXAMLOPS_BATCH__MAX_SIZE": "4",
    "EXAMLOPS_JOBS__BATCH_SIZE": "4",
}


def instances(count: int) -> list[dict[str, Any]]:
    rng = np.random.default_rng(7)
    return [{"embedding": [float(v) for v in rng.normal(0, 0.05, 384)], "node_count": 1 + i % 50} for i in range(count)]


def add_caller(settings: Settings, name: str) -> dict[str, str]:
    """A ``caller`` identity in the SQL of ``settings``; the headers that authenticate as it."""
    issued, now = new_token(), datetime.now(UTC)
    engine = sql_engine(settings)
    try:
        SqlIdentityStore(engine).add(
            Identity(name=name, role=Role.CALLER, created=now),
            IdentityKey(issued.key_id, name, issued.secret_sha256, issued.bus_key, now),
        )
    finally:
        engine.dispose()
    return {"Authorization": f"Bearer {issued.token}"}


def seeded_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A state folder with the JPCP demo model, as `exa up` leaves it."""
    home = tmp_path_factory.mktemp("jobs")
    catalog_dir = home / "catalog"
    catalog_dir.mkdir()
    shutil.copy(Settings().catalog_path / "jpcp.yaml", catalog_dir)
    settings = Settings(home=home, catalog_dir=catalog_dir)
    seed_demo(settings, load_catalog(settings.catalog_path))
    return home


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return seeded_home(tmp_path_factory)


def start(home: Path, port: int | None = None) -> ServingProcess:
    server = ServingProcess(home, env={**ENV, "EXAMLOPS_CATALOG_DIR": str(home / "catalog")}, port=port)
    server.wait_ready()
    return server


@pytest.fixture(scope="module")
def server(home: Path) -> Iterator[ServingProcess]:
    server = start(home)
    try:
        yield server
    finally:
        assert server.stop() == 0, server.log_tail()


def wait_for(server: ServingProcess, job_id: str, done: Any, timeout_s: float = 120.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        job: dict[str, Any] = httpx.get(f"{server.url}/v1/jobs/{job_id}", headers=server.auth, timeout=10).json()
        if done(job):
            return job
        time.sleep(0.1)
    raise AssertionError(f"job {job_id} did not get there: {job}\n{server.log_tail()}")


def result_lines(server: ServingProcess, job_id: str) -> list[dict[str, Any]]:
    reply = httpx.get(f"{server.url}/v1/jobs/{job_id}/result", headers=server.auth, timeout=60)
    assert reply.status_code == 200 and reply.headers["content-type"].startswith("application/x-ndjson")
    return [json.loads(line) for line in reply.text.splitlines()]


def test_a_job_is_accepted_at_once_runs_to_done_and_its_results_come_inline_and_by_download(
    server: ServingProcess,
) -> None:
    body = {"task": TASK, "budget_ms": 600_000, "instances": instances(30)}
    accepted = httpx.post(f"{server.url}/v1/jobs", json=body, headers=server.auth, timeout=10)
    assert accepted.status_code == 202, accepted.text
    job_id = accepted.json()["job_id"]
    assert accepted.json()["state"] in ("queued", "running")
    job = wait_for(server, job_id, lambda j: j["state"] == "done")
    assert job["progress"] == {"answered": 30, "errors": 0, "total": 30, "batches_done": 8, "batches": 8}
    assert (job["model"], job["alias"], job["task"]) == ("JPCP", "Production", TASK)
    assert [r["index"] for r in job["results"]] == list(range(30))
    assert job["result_url"] == f"/v1/jobs/{job_id}/result"
    downloaded = result_lines(server, job_id)
    assert downloaded == job["results"]
    assert all(r["version"] == "1" and np.isfinite(r["prediction"]) for r in downloaded)
    trace = wait_trace(server, job["trace_id"])
    assert (trace["job_id"], trace["outcome"], trace["task"], trace["budget_ms"]) == (job_id, "answered", TASK, 600_000)


def wait_trace(server: ServingProcess, trace_id: str) -> dict[str, Any]:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        reply = httpx.get(f"{server.url}/v1/traces/{trace_id}", headers=server.auth, timeout=10)
        if reply.status_code == 200:
            data: dict[str, Any] = reply.json()
            return data
        time.sleep(0.2)
    raise AssertionError(f"no trace {trace_id}")


def test_a_caller_sees_and_cancels_only_its_own_jobs(server: ServingProcess, home: Path) -> None:
    alice = add_caller(Settings(home=home), "alice")
    bob = add_caller(Settings(home=home), "bob")
    body = {"task": TASK, "budget_ms": 600_000, "instances": instances(3)}
    job_id = httpx.post(f"{server.url}/v1/jobs", json=body, headers=alice, timeout=10).json()["job_id"]
    assert httpx.get(f"{server.url}/v1/jobs/{job_id}", headers=bob, timeout=10).status_code == 404
    assert httpx.delete(f"{server.url}/v1/jobs/{job_id}", headers=bob, timeout=10).status_code == 404
    assert [j["job_id"] for j in httpx.get(f"{server.url}/v1/jobs", headers=alice, timeout=10).json()] == [job_id]
    assert httpx.get(f"{server.url}/v1/jobs", headers=bob, timeout=10).json() == []
    assert job_id in {j["job_id"] for j in httpx.get(f"{server.url}/v1/jobs", headers=server.auth, timeout=10).json()}
    unknown = httpx.post(f"{server.url}/v1/jobs", json={**body, "task": "no.such"}, headers=alice, timeout=10)
    assert unknown.status_code == 404 and unknown.json()["code"] == "unknown_task"
    assert httpx.post(f"{server.url}/v1/jobs", json=body, timeout=10).status_code == 401


def test_the_cli_submits_follows_and_downloads_a_job(server: ServingProcess, home: Path, tmp_path: Path) -> None:
    env = {"EXAMLOPS_HOME": str(home), "EXAMLOPS_SERVING__PORT": str(server.port), "EXAMLOPS_TOKEN": server.token}
    source = tmp_path / "instances.jsonl"
    source.write_text("".join(json.dumps(i) + "\n" for i in instances(9)))
    runner = CliRunner()
    submitted = runner.invoke(
        exa, ["jobs", "submit", "--task", TASK, "--file", str(source), "--budget", "1h", "--json"], env=env
    )
    assert submitted.exit_code == 0, submitted.output
    job_id = json.loads(submitted.stdout)["job_id"]
    wait_for(server, job_id, lambda j: j["state"] == "done")
    status = runner.invoke(exa, ["jobs", "status", job_id, "--json"], env=env)
    assert status.exit_code == 0 and json.loads(status.stdout)["progress"]["answered"] == 9
    out = tmp_path / "results.jsonl"
    fetched = runner.invoke(exa, ["jobs", "result", job_id, "--output", str(out)], env=env)
    assert fetched.exit_code == 0, fetched.output
    assert [json.loads(line)["index"] for line in out.read_text().splitlines()] == list(range(9))
    listed = runner.invoke(exa, ["jobs", "list", "--json"], env=env)
    assert job_id in {j["job_id"] for j in json.loads(listed.stdout)}
    cancelled = runner.invoke(exa, ["jobs", "cancel", job_id, "--json"], env=env)
    assert json.loads(cancelled.stdout)["state"] == "done"  # an ended job is left as it is
    said = runner.invoke(exa, ["jobs", "cancel", job_id], env=env)
    assert said.exit_code == 0 and "had already ended (done): nothing to cancel" in said.output
    missing = runner.invoke(exa, ["jobs", "status", "0" * 32], env=env)
    assert missing.exit_code == 4
    # A failed download leaves the file it was to replace as it was; a missing folder is a usage error.
    unknown = runner.invoke(exa, ["jobs", "result", "0" * 32, "--output", str(out)], env=env)
    assert unknown.exit_code == 4
    assert [json.loads(line)["index"] for line in out.read_text().splitlines()] == list(range(9))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["instances.jsonl", "results.jsonl"]
    nowhere = runner.invoke(exa, ["jobs", "result", job_id, "--output", str(tmp_path / "no" / "r.jsonl")], env=env)
    assert nowhere.exit_code == 2 and "there is no folder" in " ".join(nowhere.output.split())


def test_a_job_resumes_after_a_restart_of_serving_without_answering_any_instance_twice(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    home = seeded_home(tmp_path_factory)  # its own: the module's serving would take the job over meanwhile
    total = 4000
    big = home / "big.jsonl"
    big.write_text("".join(json.dumps(i) + "\n" for i in instances(total)))
    first = start(home)
    port = first.port
    try:
        body = {"task": TASK, "budget_ms": 3_600_000, "file": "big.jsonl"}
        accepted = httpx.post(f"{first.url}/v1/jobs", json=body, headers=first.auth, timeout=10)
        assert accepted.status_code == 202, accepted.text
        job_id = accepted.json()["job_id"]
        wait_for(first, job_id, lambda j: j["progress"]["batches_done"] >= 5)
    finally:
        assert first.stop() == 0, first.log_tail()
    second = start(home, port=port)
    try:
        stopped_at = httpx.get(f"{second.url}/v1/jobs/{job_id}", headers=second.auth, timeout=10).json()
        assert stopped_at["state"] == "running" and 5 <= stopped_at["progress"]["answered"] < total, stopped_at
        job = wait_for(second, job_id, lambda j: j["state"] != "running" and j["state"] != "queued", timeout_s=600)
        assert job["state"] == "done" and job["results"] is None
        assert (job["progress"]["answered"], job["progress"]["errors"]) == (total, 0)
        indices = [line["index"] for line in result_lines(second, job_id)]
        assert indices == list(range(total))
    finally:
        assert second.stop() == 0, second.log_tail()
