"""Hot reload, refusal of bad versions, polling, promotion and drain against a real MLflow store and real servers.

One store is seeded for the module (the demo models, plus BADS with one good and four bad versions,
plus SLEEPY whose predict sleeps half a second); every server reads it. Each test moves the aliases
of its own model and puts them back:

- JPCP: alias flips under load;            - BADS: refused versions;
- CRCP: polling on and off;                - AC: promotion and rollback;
- the store itself is made unreadable once (test d), for the polling server only.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cloudpickle
import httpx
import numpy as np
import pytest
import typer
from typer.testing import CliRunner

from examlops.cli import promote as promote_cli
from examlops.cli.main import app as exa
from examlops.core.errors import PromotionIncomplete
from examlops.core.settings import Settings
from examlops.promotion.aliases import previous_tag
from examlops.promotion.service import promote, rollback
from examlops.registry.catalog import load_catalog
from examlops.registry.demo import seed_demo
from examlops.registry.mlflow_registry import MlflowRegistry
from tests.integration import badmodels, sleepy
from tests.integration.servers import ServingProcess
from tests.ports import free_port

pytestmark = [
    pytest.mark.integration,
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::UserWarning"),
    pytest.mark.filterwarnings("ignore::FutureWarning"),
]

YAML = """name: {name}
seanerbus_uuid: 00000000-0000-4000-8000-00000000000{n}
default_alias: Production
input_schema:
  embedding: {{type: float_array, length: 384}}
  node_count: {{type: integer, minimum: 1}}
tasks: [test.{lower}]
"""


@dataclass
class Store:
    home: Path
    settings: Settings
    catalog_dir: Path
    registry: MlflowRegistry
    bad: dict[str, str]
    """Kind of bad version -> its version number in BADS (version 1 is good)."""

    def set_alias(self, model: str, alias: str, version: str) -> None:
        self.registry.set_alias(model, alias, version)


def _log(settings: Settings, model: Any, name: str) -> str:
    import mlflow
    import mlflow.sklearn

    mlflow.set_tracking_uri(settings.mlflow_tracking_uri)
    client = mlflow.MlflowClient(settings.mlflow_tracking_uri)
    experiment = client.get_experiment_by_name("examlops-tests")
    if experiment is None:
        location = (settings.mlflow_artifact_root / "tests").as_uri()
        experiment_id = client.create_experiment("examlops-tests", artifact_location=location)
    else:
        experiment_id = experiment.experiment_id
    with mlflow.start_run(experiment_id=experiment_id):
        info = mlflow.sklearn.log_model(
            model,
            name="model",
            serialization_format="cloudpickle",
            pip_requirements=["scikit-learn"],
            registered_model_name=name,
        )
    return str(info.registered_model_version)


def _linear(columns: int) -> Any:
    from sklearn.linear_model import LinearRegression

    rng = np.random.default_rng(columns)
    return LinearRegression().fit(rng.normal(size=(20, columns)), rng.normal(size=20))


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Store:
    home = tmp_path_factory.mktemp("reload")
    settings = Settings(home=home)
    seed_demo(settings, load_catalog(settings.catalog_path))
    catalog_dir = home / "catalog"
    shutil.copytree(settings.catalog_path, catalog_dir)
    for n, name in enumerate(("BADS", "SLEEPY"), start=2):
        (catalog_dir / f"{name.lower()}.yaml").write_text(YAML.format(name=name, n=n, lower=name.lower()))
    cloudpickle.register_pickle_by_value(sleepy)
    cloudpickle.register_pickle_by_value(badmodels)
    registry = MlflowRegistry(settings.mlflow_tracking_uri, home / "cache")

    good = _log(settings, _linear(385), "BADS")
    bad = {
        "missing artifact": _log(settings, _linear(385), "BADS"),
        "corrupt file": _log(settings, _linear(385), "BADS"),
        "wrong input size": _log(settings, _linear(10), "BADS"),
        "exception while loading": _log(
            settings, badmodels.ExplodingRegressor().fit(np.zeros((2, 385)), np.zeros(2)), "BADS"
        ),
    }
    shutil.rmtree(registry.fetch(registry.version("BADS", bad["missing artifact"])))
    corrupt = Path(registry.fetch(registry.version("BADS", bad["corrupt file"])))
    for pickled in corrupt.glob("*.pkl"):
        pickled.write_bytes(b"this is not a pickle")
    registry.set_alias("BADS", "Production", good)

    slow = _log(settings, sleepy.SleepyRegressor(0.5).fit(np.zeros((2, 385)), np.zeros(2)), "SLEEPY")
    registry.set_alias("SLEEPY", "Production", slow)
    return Store(home, settings, catalog_dir, registry, bad)


def _serving(store: Store, **env: str) -> ServingProcess:
    return ServingProcess(
        store.home,
        env={"EXAMLOPS_CATALOG_DIR": str(store.catalog_dir), "EXAMLOPS_PREDICT__WORKERS": "1", **env},
    )


@pytest.fixture(scope="module")
def servers(store: Store) -> Iterator[tuple[ServingProcess, ServingProcess]]:
    """``still`` never polls; ``polling`` asks MLflow every second and opens the SQLite file on every call
    (NullPool), so that test d can make the store unreadable for it alone."""
    still = _serving(store, EXAMLOPS_HOTSET__RELOAD_POLL_S="0")
    polling = _serving(store, EXAMLOPS_HOTSET__RELOAD_POLL_S="1", MLFLOW_SQLALCHEMYSTORE_POOLCLASS="NullPool")
    try:
        still.wait_ready()
        polling.wait_ready()
        yield still, polling
    finally:
        for proc in (still, polling):
            assert proc.stop() == 0, proc.log_tail()


@pytest.fixture
def still(servers: tuple[ServingProcess, ServingProcess]) -> ServingProcess:
    return servers[0]


@pytest.fixture
def polling(servers: tuple[ServingProcess, ServingProcess]) -> ServingProcess:
    return servers[1]


def body(model: str, seed: int = 0) -> dict[str, Any]:
    embedding = [float(v) for v in np.random.default_rng(seed).normal(0, 0.05, 384)]
    return {"model": model, "embedding": embedding, "node_count": 12}


def infer(server: ServingProcess, model: str) -> httpx.Response:
    return httpx.post(f"{server.url}/infer-pipeline/infer", json=body(model), timeout=30, headers=server.auth)


def row(server: ServingProcess, model: str, alias: str = "Production") -> dict[str, Any]:
    rows = httpx.get(f"{server.url}/v1/models", timeout=10, headers=server.auth).json()
    return next(r for r in rows if r["model"] == model and r["alias"] == alias)


def reload(server: ServingProcess, model: str) -> list[dict[str, Any]]:
    reply = httpx.post(f"{server.url}/admin/reload", json={"model": model}, timeout=60, headers=server.auth)
    assert reply.status_code == 200, reply.text
    changes: list[dict[str, Any]] = reply.json()["changes"]
    return changes


def wait_for(check: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not happen within {timeout_s} s")
        time.sleep(0.2)


# (a) alias flips under concurrent requests


async def _load_while_flipping(store: Store, server: ServingProcess, flips: int) -> tuple[list[Any], list[Any]]:
    """16 clients send JPCP requests while Production flips ``flips`` times; returns replies and the timeline."""
    replies: list[tuple[float, float, int, str | None]] = []
    timeline: list[tuple[str, float, float]] = [("1", 0.0, 0.0)]  # version, moved in MLflow, reload answered
    stop = asyncio.Event()
    async with httpx.AsyncClient(base_url=server.url, timeout=30, headers=server.auth) as client:

        async def clientloop(i: int) -> None:
            while not stop.is_set():
                started = time.monotonic()
                try:
                    reply = await client.post("/infer-pipeline/infer", json=body("JPCP", i))
                    status, version = reply.status_code, reply.json().get("version")
                except httpx.HTTPError as exc:
                    status, version = 0, type(exc).__name__
                replies.append((started, time.monotonic(), status, version))

        async def flipper() -> None:
            await asyncio.sleep(0.5)
            for flip in range(flips):
                version = "2" if flip % 2 == 0 else "1"
                moved = time.monotonic()
                await asyncio.to_thread(store.set_alias, "JPCP", "Production", version)
                reply = await client.post("/admin/reload", json={"model": "JPCP"}, timeout=60)
                assert reply.status_code == 200, reply.text
                outcomes = [c["outcome"] for c in reply.json()["changes"]]
                assert outcomes == ["swapped"], reply.text
                timeline.append((version, moved, time.monotonic()))
                await asyncio.sleep(0.3)
            await asyncio.sleep(0.5)
            stop.set()

        await asyncio.gather(flipper(), *(clientloop(i) for i in range(16)))
    return replies, timeline


def test_alias_flips_under_concurrent_requests_fail_none_and_answer_only_with_valid_versions(
    store: Store, still: ServingProcess
) -> None:
    try:
        replies, timeline = asyncio.run(_load_while_flipping(store, still, flips=10))
    finally:
        store.set_alias("JPCP", "Production", "1")
        reload(still, "JPCP")
    failed = [r for r in replies if r[2] != 200]
    assert not failed, failed[:5]
    assert len(replies) > 100
    seen = {version for *_, version in replies}
    assert seen == {"1", "2"}
    # A version may answer a request only if it could have been serving at some point of that request:
    # from its move in MLflow until the reload that replaced it answered.
    spans = [
        (version, moved, timeline[k + 1][2] if k + 1 < len(timeline) else float("inf"))
        for k, (version, moved, _) in enumerate(timeline)
    ]
    for started, ended, _, version in replies:
        assert any(v == version and started <= until and ended >= since for v, since, until in spans), (
            started,
            ended,
            version,
        )


# (b) a bad version is refused and the old one keeps serving


@pytest.mark.parametrize(
    ("kind", "reason"),
    [
        ("missing artifact", "artifact folder"),
        ("corrupt file", "cannot load model version"),
        ("wrong input size", "takes 10 input columns, the catalog gives 385"),
        ("exception while loading", "this model explodes while it is loaded"),
    ],
)
def test_a_bad_version_is_refused_and_the_old_one_keeps_serving(
    store: Store, still: ServingProcess, kind: str, reason: str
) -> None:
    bad = store.bad[kind]
    store.set_alias("BADS", "Production", bad)
    try:
        changes = reload(still, "bads")
        assert [(c["old_version"], c["new_version"], c["outcome"]) for c in changes] == [("1", bad, "refused")]
        assert reason in changes[0]["reason"]
        answered = infer(still, "BADS")
        assert answered.status_code == 200, answered.text
        assert answered.json()["version"] == "1"
        shown = row(still, "BADS")
        assert (shown["version"], shown["state"]) == ("1", "degraded")
        assert f"version {bad} refused" in shown["reason"] and reason in shown["reason"]
        check = CliRunner().invoke(exa, ["serve", "check", "--url", still.url, "--json"])
        assert check.exit_code == 0, check.output
        models = json.loads(check.stdout)["models"]
        (checked,) = [m for m in models if (m["model"], m["alias"]) == ("BADS", "Production")]
        assert checked["state"] == "degraded" and reason in checked["reason"]
        assert f"model=BADS alias=Production version={bad} serving=1" in still.log_path.read_text()
    finally:
        store.set_alias("BADS", "Production", "1")
    reload(still, "BADS")
    assert row(still, "BADS")["state"] == "ready"


# (c) polling


def test_polling_picks_up_a_moved_alias_by_itself_and_poll_0_does_not(
    store: Store, still: ServingProcess, polling: ServingProcess
) -> None:
    store.set_alias("CRCP", "Production", "2")
    try:
        wait_for(lambda: row(polling, "CRCP")["version"] == "2", 20, "the polling server following CRCP")
        assert infer(polling, "CRCP").json()["version"] == "2"
        time.sleep(3)  # several poll intervals of the other server
        assert row(still, "CRCP")["version"] == "1"
        assert infer(still, "CRCP").json()["version"] == "1"
    finally:
        store.set_alias("CRCP", "Production", "1")
    wait_for(lambda: row(polling, "CRCP")["version"] == "1", 20, "the polling server following CRCP back")


# (d) MLflow unreachable during polls


def test_an_unreachable_registry_keeps_serving_and_shows_the_staleness(store: Store, polling: ServingProcess) -> None:
    db = store.settings.mlflow_dir / "mlflow.db"
    aside = db.with_name("mlflow.db.aside")
    # Opening a directory as SQLite fails at once ("unable to open database file"): MLflow cannot read
    # its store, as when a server is down, without its minutes of HTTP retries.
    db.rename(aside)
    db.mkdir()
    try:

        def stale() -> bool:
            ready = httpx.get(f"{polling.url}/readyz", timeout=10).json()
            return any("stale since" in (m["reason"] or "") for m in ready["models"])

        wait_for(stale, 20, "staleness showing in /readyz")
        replies = [infer(polling, model) for model in ("JPCP", "CRCP", "AC", "BADS") * 5]
        assert [r.status_code for r in replies] == [200] * 20
        check = CliRunner().invoke(exa, ["serve", "check", "--url", polling.url, "--json"])
        assert check.exit_code == 0, check.output
        reasons = [m["reason"] or "" for m in json.loads(check.stdout)["models"] if m["version"]]
        assert reasons and all("registry was unreachable" in r for r in reasons), reasons
        table = CliRunner().invoke(exa, ["serve", "check", "--url", polling.url])
        assert "stale" in table.output
    finally:
        db.rmdir()
        aside.rename(db)
    wait_for(lambda: not stale(), 30, "staleness clearing once the registry answers")
    assert "the model registry is unreachable; serving what is loaded, next poll in 2 s" in polling.log_path.read_text()


# (e) promotion reaches every instance


def test_promotion_reaches_two_servers_and_rollback_moves_it_back(
    store: Store, still: ServingProcess, polling: ServingProcess
) -> None:
    urls = [still.url, polling.url]
    result = promote(
        store.settings, store.registry, "ac", "production", version=2, instances=urls, timeout_s=60, token=still.token
    )
    assert (result.model, result.alias, result.old_version, result.new_version) == ("AC", "Production", "1", "2")
    assert result.instances == tuple(urls)
    assert [row(s, "AC")["version"] for s in (still, polling)] == ["2", "2"]
    assert store.registry.model_tags("AC")[previous_tag("Production")] == "1"

    back = rollback(store.settings, store.registry, "AC", instances=urls, timeout_s=60, token=still.token)
    assert (back.old_version, back.new_version, back.instances) == ("2", "1", tuple(urls))
    assert [row(s, "AC")["version"] for s in (still, polling)] == ["1", "1"]
    assert [infer(s, "AC").json()["version"] for s in (still, polling)] == ["1", "1"]


def test_promotion_from_an_alias_names_a_dead_instance_and_exits_non_zero(
    store: Store, still: ServingProcess, polling: ServingProcess, monkeypatch: pytest.MonkeyPatch, redis_server: str
) -> None:
    monkeypatch.setenv("EXAMLOPS_HOME", str(store.home))
    dead = f"http://127.0.0.1:{free_port()}"
    cli = typer.Typer()
    promote_cli.register(cli)
    runner = CliRunner()
    urls = ["--url", still.url, "--url", polling.url]
    try:
        # Without its audit trail (Redis down) a promotion is refused before anything moves.
        monkeypatch.setenv("EXAMLOPS_REDIS__URL", f"redis://127.0.0.1:{free_port()}/0")
        refused = runner.invoke(cli, ["promote", "AC", "--alias", "Production", "--from", "canary", *urls])
        assert refused.exit_code == 3, refused.output
        assert store.registry.resolve("AC", "Production").version == "1"
        monkeypatch.setenv("EXAMLOPS_REDIS__URL", redis_server)
        moved = runner.invoke(cli, ["promote", "AC", "--alias", "Production", "--from", "canary", *urls, "--url", dead])
        assert moved.exit_code == 1, moved.output
        flat = "".join(moved.output.split())
        assert dead in flat and "cannotbereached" in flat and "thatmovestaysdone" in flat
        assert [row(s, "AC")["version"] for s in (still, polling)] == ["2", "2"]  # the live ones followed

        # Production is at 2 already: a promotion there moves nothing, and still names the dead instance.
        with pytest.raises(PromotionIncomplete) as raised:
            promote(store.settings, store.registry, "AC", "Production", version=2, instances=[still.url, dead],
                    token=still.token)  # fmt: skip
        assert list(raised.value.lagging) == [dead] and raised.value.confirmed == (still.url,)
    finally:
        back = runner.invoke(cli, ["rollback", "ac", *urls, "--json"])
    assert back.exit_code == 0, back.output
    assert json.loads(back.stdout) == {
        "model": "AC",
        "alias": "Production",
        "old_version": "2",
        "new_version": "1",
        "instances": [still.url, polling.url],
        "unaccounted": None,
        "warnings": [],
        "nothing_to_do": False,
    }
    assert runner.invoke(cli, ["promote", "AC", "--alias", "Production"]).exit_code == 2


# (f) SIGTERM with requests in flight


async def _drain(server: ServingProcess, count: int, group: bool) -> tuple[list[int], list[int]]:
    async with httpx.AsyncClient(
        base_url=server.url, timeout=30, limits=httpx.Limits(max_connections=100), headers=server.auth
    ) as client:
        sent = [asyncio.create_task(client.post("/infer-pipeline/infer", json=body("SLEEPY", i))) for i in range(count)]

        async def in_flight() -> float:
            text = (await client.get("/metrics")).text
            line = next(x for x in text.splitlines() if x.startswith("examlops_requests_in_flight "))
            return float(line.split()[1])

        deadline = time.monotonic() + 10
        while await in_flight() < count and time.monotonic() < deadline:  # noqa: ASYNC110 - another process's state
            await asyncio.sleep(0.01)
        if group:  # what systemd's default stop does: the predict workers and their fork server get it too
            os.killpg(server.proc.pid, signal.SIGTERM)
        else:
            os.kill(server.proc.pid, signal.SIGTERM)
        probes: list[int] = []
        while not all(task.done() for task in sent):
            try:  # a new connection each time, as a load balancer's probe
                probes.append((await asyncio.to_thread(httpx.get, f"{server.url}/readyz", timeout=5)).status_code)
            except httpx.TransportError:
                probes.append(0)
            await asyncio.sleep(0.05)
        return [(await task).status_code for task in sent], probes


@pytest.mark.parametrize("group", [False, True], ids=["to-serving", "to-its-process-group"])
def test_sigterm_with_requests_in_flight_loses_none_and_exits_0(store: Store, group: bool) -> None:
    server = _serving(
        store,
        EXAMLOPS_PREDICT__WORKERS="2",
        EXAMLOPS_PREDICT__TIMEOUT_S="20",
        EXAMLOPS_HOTSET__RELOAD_POLL_S="0",
        EXAMLOPS_SERVING__DRAIN_GRACE_S="20",
    )
    try:
        server.wait_ready()
        statuses, probes = asyncio.run(_drain(server, 32, group))
        assert server.proc.wait(30) == 0, server.log_tail()
    finally:
        code = server.stop()
    assert code == 0
    assert statuses == [200] * 32
    assert 503 in probes, probes
