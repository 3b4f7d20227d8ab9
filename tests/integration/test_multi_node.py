"""A multi-node rehearsal on one machine: two serving instances and two bridges sharing one Redis, one Postgres
and one MLflow store, as `README.md` ("Running on several machines") sets a site up.

Each "machine" (a and b) has a state folder of its own, one serving instance and one bridge whose hop posts to
that instance. What the bus promises (``examlops/bus/README.md``) and so what is asserted:

- every job is answered exactly once (one reply entry per job id on the client's reply stream);
- a bridge's hop never retries: when its serving instance is gone, the jobs that bridge reads are answered once
  with ``pipeline_unavailable`` (never a model failure), while the other machine goes on serving its share;
- a bridge that dies holding jobs loses none: the other bridge reclaims them (after the hop's connect plus read
  timeout) and serves them, so when a whole machine (serving and bridge) is SIGKILLed under load every job is
  still answered once, and served.

The tests run in order and share the site: 1 spread, 2 promotion, 3 serving a killed, 4 machine a killed.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
import sqlalchemy
from pydantic import SecretStr

from examlops.bootstrap.bridge import bus_client
from examlops.core.settings import Settings
from examlops.promotion.service import promote
from examlops.registry.catalog import load_catalog
from examlops.registry.demo import seed_demo
from examlops.registry.mlflow_registry import MlflowRegistry
from tests.integration.servers import ServingProcess, examlops_env, known_token, upgraded
from tests.ports import free_port

pytestmark = [
    pytest.mark.integration,
    pytest.mark.timeout(300),
    pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::FutureWarning", "ignore::UserWarning"),
]

DB = 12
"""A Redis database of this module's own on the session's redis-server."""
TOKEN = f"exa_{secrets.token_hex(8)}_{secrets.token_urlsafe(32)}"
"""The site's operator token (an admin identity in the shared SQL): the clients sign bus jobs with it."""
PAYLOAD = {"embedding": [0.01] * 384, "node_count": 12}


@dataclass
class Bridge:
    """`exa bridge start` in a child process of its own session."""

    home: Path
    env: dict[str, str]
    log_path: Path = field(init=False)
    proc: subprocess.Popen[bytes] = field(init=False)

    def __post_init__(self) -> None:
        self.log_path = self.home / "bridge.log"
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "examlops.cli.main", "bridge", "start", "--log-level", "info"],
                env=examlops_env(self.home, **self.env),
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def wait_ready(self, timeout_s: float = 60) -> None:
        deadline = time.monotonic() + timeout_s
        while " ready: " not in self.log_path.read_text(errors="replace"):
            assert self.proc.poll() is None, f"bridge exited:\n{self.log_path.read_text(errors='replace')}"
            assert time.monotonic() < deadline, f"bridge not ready:\n{self.log_path.read_text(errors='replace')}"
            time.sleep(0.2)

    def kill(self) -> None:
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.kill()


@dataclass
class Site:
    settings: Settings
    """The operator's settings: the shared Redis, Postgres and MLflow, both instances in ``serving.instances``."""
    registry: MlflowRegistry
    address: str
    env: dict[str, str]
    """Every machine's shared settings."""
    homes: dict[str, Path]
    serving: dict[str, ServingProcess]
    bridges: dict[str, Bridge]

    def kill_serving(self, name: str) -> None:
        """SIGKILL instance ``name`` and its predict workers (its session)."""
        server = self.serving[name]
        os.killpg(server.proc.pid, signal.SIGKILL)
        server.proc.wait()
        killed.append(server)

    def start_serving(self, name: str, port: int | None = None) -> ServingProcess:
        env = {**self.env, "EXAMLOPS_TRACING__NODE": f"serve-{name}"}
        self.serving[name] = ServingProcess(self.homes[name], env=env, port=port)
        return self.serving[name]


killed: list[ServingProcess] = []
"""Instances SIGKILLed by a test: their log files are closed at teardown, nothing else is left to stop."""


def _database(postgres_server: str) -> Iterator[str]:
    name = f"site_{uuid.uuid4().hex[:12]}"
    admin = sqlalchemy.create_engine(postgres_server, isolation_level="AUTOCOMMIT", poolclass=sqlalchemy.NullPool)
    with admin.connect() as connection:
        connection.exec_driver_sql(f"CREATE DATABASE {name}")
    yield postgres_server.rsplit("/", 1)[0] + f"/{name}"
    with admin.connect() as connection:
        connection.exec_driver_sql(f"DROP DATABASE {name} WITH (FORCE)")
    admin.dispose()


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory, redis_server: str, postgres_server: str) -> Iterator[Site]:
    root = tmp_path_factory.mktemp("site")
    catalog_dir = root / "catalog"
    catalog_dir.mkdir()
    shutil.copy(Settings().catalog_path / "jpcp.yaml", catalog_dir)  # one model keeps the seed and the load short
    redis_url = f"{redis_server.rsplit('/', 1)[0]}/{DB}"
    with redis.Redis.from_url(redis_url) as client:
        client.flushdb()
    store = Settings(home=root / "mlflow-host", catalog_dir=catalog_dir)
    seed_demo(store, load_catalog(catalog_dir))  # JPCP: Production -> 1, Canary -> 2
    database = _database(postgres_server)
    database_url = next(database)
    env = {
        "EXAMLOPS_CATALOG_DIR": str(catalog_dir),
        "EXAMLOPS_REDIS__URL": redis_url,
        "EXAMLOPS_DATABASE_URL": database_url,
        "EXAMLOPS_MLFLOW__TRACKING_URI": store.mlflow_tracking_uri,
        "EXAMLOPS_PREFECT__API_URL": f"http://127.0.0.1:{free_port()}/api",  # nobody there: no retrain runs
        "EXAMLOPS_PREDICT__WORKERS": "1",
        "EXAMLOPS_HOTSET__RELOAD_POLL_S": "0",  # a promotion, not a poll, must reach the instances
        # The hop's timeouts set how soon a dead bridge's jobs are reclaimed (connect + read + 2 s).
        "EXAMLOPS_HTTP__CONNECT_TIMEOUT_S": "1",
        "EXAMLOPS_HTTP__READ_TIMEOUT_S": "3",
    }
    homes = {name: root / f"machine-{name}" for name in ("a", "b")}
    for home in homes.values():
        home.mkdir()
    # `exa db upgrade` once for the site, from machine a; the operator's identity in the shared SQL.
    upgraded(examlops_env(homes["a"], **env))
    operator = Settings(
        home=homes["a"],
        catalog_dir=catalog_dir,
        redis={"url": redis_url},
        database_url=database_url,
        mlflow={"tracking_uri": store.mlflow_tracking_uri},
        token=SecretStr(TOKEN),
    )
    known_token(operator, TOKEN, name="operator")
    for token in ("admin.token", "bridge.token"):  # machine b is handed the site's tokens
        shutil.copy(homes["a"] / token, homes["b"] / token)
    address = str(load_catalog(catalog_dir).get("JPCP").seanerbus_uuid)
    registry = MlflowRegistry(store.mlflow_tracking_uri, root / "cache")
    built = Site(operator, registry, address, env, homes, {}, {})
    try:
        for name in homes:
            built.start_serving(name)
        for name, server in built.serving.items():
            built.bridges[name] = Bridge(homes[name], {**env, "EXAMLOPS_SERVING__PORT": str(server.port)})
        for server in built.serving.values():
            server.wait_ready(120)
        for bridge in built.bridges.values():
            bridge.wait_ready()
        urls = tuple(server.url for server in built.serving.values())
        built.settings = operator.model_copy(
            update={"serving": operator.serving.model_copy(update={"instances": urls})}
        )
        yield built
    finally:
        for bridge in built.bridges.values():
            bridge.stop()
        for server in built.serving.values():
            if server.proc.poll() is None:
                assert server.stop() == 0, server.log_tail()
        for server in killed:
            server.close_log()
        next(database, None)


@dataclass(frozen=True)
class Answer:
    job_id: str
    sent: float
    reply: dict[str, Any]


def send_jobs(
    site: Site, jobs: int, *, concurrency: int = 16, after: int | None = None, action: Callable[[], None] | None = None
) -> tuple[list[Answer], float | None, str]:
    """``jobs`` bus jobs to JPCP's address, ``concurrency`` at a time; once ``after`` replies came, ``action`` runs
    (off the event loop) while the load goes on. The answers, when the action finished, and the reply stream."""
    client_id = uuid.uuid4().hex
    acted: list[float] = []

    async def run() -> list[Answer]:
        gate = asyncio.Semaphore(concurrency)
        answers: list[Answer] = []
        act: asyncio.Task[None] | None = None

        async def one(client: Any, i: int) -> None:
            nonlocal act
            async with gate:
                job_id = f"{client_id[:8]}-{i}"
                sent = time.monotonic()
                reply = await client.request(site.address, PAYLOAD, 30, job_id=job_id)
                answers.append(Answer(job_id, sent, reply))
                if action is not None and act is None and len(answers) >= (after or 0):
                    act = asyncio.create_task(asyncio.to_thread(lambda: (action(), acted.append(time.monotonic()))))

        async with bus_client(site.settings, token=TOKEN, client_id=client_id) as client:
            await asyncio.gather(*(one(client, i) for i in range(jobs)))
        if act is not None:
            await act
        return answers

    answers = asyncio.run(run())
    return answers, (acted[0] if acted else None), f"examlops:bus:replies:{client_id}"


def replies_per_job(site: Site, stream: str) -> Counter[str]:
    with redis.Redis.from_url(site.env["EXAMLOPS_REDIS__URL"], decode_responses=True) as client:
        return Counter(fields["job_id"] for _id, fields in client.xrange(stream))


def served(server: ServingProcess) -> float:
    """JPCP calls this instance answered so far (its `/metrics`)."""
    text = httpx.get(f"{server.url}/metrics", timeout=5).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("examlops_requests_total{") and 'model="JPCP"' in line
    )


def versions(site: Site) -> list[str]:
    rows = [httpx.get(f"{s.url}/v1/models", headers=s.auth, timeout=5).json() for s in site.serving.values()]
    return [next(r["version"] for r in row if r["model"] == "JPCP" and r["alias"] == "Production") for row in rows]


def test_bus_jobs_spread_over_both_bridges_and_each_is_answered_exactly_once(site: Site) -> None:
    before = {name: served(server) for name, server in site.serving.items()}
    answers, _, stream = send_jobs(site, 400)
    assert all(a.reply["error"] is None and a.reply["version"] == "1" for a in answers), answers[:3]
    per_job = replies_per_job(site, stream)
    assert len(per_job) == 400 and set(per_job.values()) == {1}
    share = {name: served(server) - before[name] for name, server in site.serving.items()}
    assert sum(share.values()) == 400  # each job posted to serving once
    assert all(count > 0 for count in share.values()), share


def test_a_promotion_reaches_both_instances_and_the_bus_answers_with_it_through_both(site: Site) -> None:
    result = promote(site.settings, site.registry, "JPCP", "Production", from_alias="Canary", token=TOKEN)
    try:
        assert (result.old_version, result.new_version) == ("1", "2")
        assert result.instances == tuple(s.url for s in site.serving.values())
        assert versions(site) == ["2", "2"]
        before = {name: served(server) for name, server in site.serving.items()}
        answers, _, _ = send_jobs(site, 100)
        assert {a.reply["version"] for a in answers} == {"2"}
        assert all(served(server) > before[name] for name, server in site.serving.items())
    finally:
        back = promote(site.settings, site.registry, "JPCP", "Production", version=1, token=TOKEN)
        assert versions(site) == ["1", "1"] and back.new_version == "1"


def test_serving_a_sigkilled_under_load_its_bridge_answers_unavailable_once_and_b_serves_on(site: Site) -> None:
    """Machine a's bridge still reads its share of the jobs and, its hop never retrying, answers each once with
    ``pipeline_unavailable`` (not a model failure); every job machine b reads is served, during and after."""
    port, b = site.serving["a"].port, site.serving["b"]

    answers, killed, stream = send_jobs(site, 600, after=150, action=lambda: site.kill_serving("a"))
    assert killed is not None
    per_job = replies_per_job(site, stream)
    assert len(per_job) == 600 and set(per_job.values()) == {1}
    codes = Counter(a.reply.get("code") for a in answers if a.reply["error"] is not None)
    assert set(codes) <= {"pipeline_unavailable"}, codes
    assert not any(a.reply.get("inference_failed") for a in answers)
    after = [a for a in answers if a.sent > killed]
    assert any(a.reply["error"] is None for a in after), "machine b served nothing after the kill"
    assert codes["pipeline_unavailable"] > 0, "machine a's bridge read none of the jobs after the kill"
    assert httpx.post(f"{b.url}/v1/models/JPCP/predict", json=PAYLOAD, headers=b.auth, timeout=10).status_code == 200

    # Machine a's serving comes back on its port: its bridge serves again, with nothing restarted there.
    site.start_serving("a", port=port).wait_ready(120)
    answers, _, _ = send_jobs(site, 100)
    assert all(a.reply["error"] is None for a in answers)


def test_machine_a_sigkilled_under_load_every_job_is_still_served_exactly_once(site: Site) -> None:
    """Serving a and bridge a SIGKILLed together while they hold jobs: bridge b reclaims what a held (after the
    hop's connect plus read timeout) and serves it; no job is lost and none is answered twice."""

    def kill_machine_a() -> None:
        site.bridges["a"].kill()
        site.kill_serving("a")

    answers, killed, stream = send_jobs(site, 600, concurrency=32, after=150, action=kill_machine_a)
    assert killed is not None
    per_job = replies_per_job(site, stream)
    assert len(per_job) == 600 and set(per_job.values()) == {1}
    failed = [a.reply for a in answers if a.reply["error"] is not None]
    assert not failed, failed[:3]
    reclaimed = [line for line in site.bridges["b"].log_path.read_text().splitlines() if "reclaimed job" in line]
    assert reclaimed, "bridge a held no job when it died: nothing was failed over"
    with redis.Redis.from_url(site.env["EXAMLOPS_REDIS__URL"], decode_responses=True) as client:
        stream_name = next(iter(client.scan_iter(match=f"examlops:bus:jobs:{site.address}")))
        assert client.xpending(stream_name, "bridges")["pending"] == 0  # nothing left held by the dead bridge
