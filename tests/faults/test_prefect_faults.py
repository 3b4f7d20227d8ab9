"""Prefect down when the failure trigger fires: the retrain request is delivered once when it returns.

Real processes: a Prefect server (``prefect_test_harness``) with the retrain deployment of prefect.yaml
registered but not served (its runs stay scheduled and can be counted), behind ``FaultProxy``; a
redis-server, bridges (`exa bridge start`, each delivering the retrain outbox to Prefect through the proxy)
and the serving stand-in answering every job with a model failure, so the shared failure window fills and
the trigger fires under load. While it fires Prefect refuses every connection (the proxy resets them) or,
in long runs, holds them unanswered (black hole); the outbox retries with backoff; then Prefect returns.

Must hold: the request is in the outbox while Prefect is down (nothing dropped), and once Prefect is back it
is delivered, by whichever bridge, as exactly one flow run carrying its idempotency key and exactly one
``retrain.requested`` audit event; the outbox is empty; the bus jobs' figures are all zero.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import orjson
import pytest
import redis

from examlops.monitoring.audit import RETRAIN_REQUESTED, STREAM
from examlops.monitoring.retrain import LAST, OUTBOX
from tests.faults.checker import check
from tests.faults.cluster import Cluster, drive, until
from tests.faults.conftest import LONG, Reporter
from tests.faults.history import History
from tests.faults.proxy import FaultProxy

pytestmark = [
    pytest.mark.timeout(900 if LONG else 240),
    pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::FutureWarning", "ignore::UserWarning"),
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
]

JOBS, CONCURRENCY = (1500, 16) if LONG else (150, 8)
BRIDGES = 4 if LONG else 2
DOWN_S = 30.0 if LONG else 4.0
"""How long Prefect stays down after the trigger fired; the outbox's backoff doubles from 1 s meanwhile."""
KINDS = ["refusing", "blackhole"] if LONG else ["refusing"]


@pytest.fixture(scope="module")
def prefect(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[FaultProxy, str]]:
    """The harness's Prefect API behind a proxy: (proxy, deployment id); its files in a temporary folder."""
    root = tmp_path_factory.mktemp("prefect-faults")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PREFECT_HOME", str(root / "prefect"))
        mp.setenv("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
        mp.chdir(root)
        from prefect.settings import PREFECT_API_URL
        from prefect.testing.utilities import prefect_test_harness

        from examlops.flows.deployments import default_path, load_deployments

        with prefect_test_harness(server_startup_timeout=90):
            [deployment] = [d for d in load_deployments(default_path()) if d.name == "retrain"]
            deployment_id = str(deployment.apply())
            api = urlsplit(str(PREFECT_API_URL.value()))
            assert api.hostname and api.port, api
            with FaultProxy(api.hostname, api.port) as proxy:
                yield proxy, deployment_id


def flow_runs(deployment_id: str) -> list[tuple[str, str | None]]:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId

    with get_client(sync_client=True) as client:
        runs = client.read_flow_runs(deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[deployment_id])))
    return [(str(run.id), run.idempotency_key) for run in runs]


def requested_events(client: redis.Redis) -> list[dict[str, Any]]:
    entries: Any = client.xrange(STREAM)
    return [orjson.loads(f["data"]) for _id, f in entries if f.get("type") == RETRAIN_REQUESTED]


@pytest.mark.parametrize("kind", KINDS)
async def test_a_retrain_asked_for_while_prefect_is_down_is_delivered_once_when_it_returns(
    prefect: tuple[FaultProxy, str], tmp_path: Path, report: Reporter, kind: str
) -> None:
    proxy, deployment_id = prefect
    runs_before = flow_runs(deployment_id)
    cluster = Cluster(tmp_path)
    try:
        cluster.serving(delay_s=0.02, fail=True)
        env = {
            "EXAMLOPS_FAILURE__WINDOW": "10",
            "EXAMLOPS_FAILURE__COOLDOWN_S": "300",
            "EXAMLOPS_PREFECT__API_URL": f"http://127.0.0.1:{proxy.port}/api",
            "PREFECT_HOME": str(tmp_path / "prefect"),
            "EXAMLOPS_RECORDING__NICE": "0",  # the recorders feed the trigger: not starved on a busy machine
        }
        bridges = [cluster.bridge(concurrency=8, wait=False, env=env) for _ in range(BRIDGES)]
        for bridge in bridges:
            bridge.wait_logged(" ready:")
        store = redis.Redis.from_url(cluster.redis.url, decode_responses=True)
        history = History()
        history.mark(f"fault:prefect_{kind}")
        if kind == "refusing":
            proxy.reset_new = True
            proxy.reset_all()
        else:
            proxy.blackhole = True
        async with cluster.client() as client:
            load = asyncio.create_task(drive(history, client, jobs=JOBS, concurrency=CONCURRENCY))
            # The trigger fired and its request was refused (nothing dropped meanwhile).
            await until(lambda: any(json.loads(v).get("attempts", 0) >= 1 for v in store.hvals(LAST)), 150)
            [key] = store.hkeys(OUTBOX)
            await asyncio.sleep(DOWN_S)
            assert store.hkeys(OUTBOX) == [key]
            proxy.clear()
            proxy.reset_all()  # what the black hole held
            history.mark(f"heal:prefect_{kind}")
            healed = asyncio.get_running_loop().time()
            await until(lambda: not store.hkeys(OUTBOX), 120)
            delivered_after = asyncio.get_running_loop().time() - healed
            await load
        figures = check(history, cluster.redis.url, cluster.settings)
        events = requested_events(store)
        last = json.loads(store.hget(LAST, "jpcp") or "{}")
        store.close()
        alive = [bridge.alive() for bridge in bridges]
    finally:
        proxy.clear()
        cluster.close()
    new_runs = [run for run in flow_runs(deployment_id) if run not in runs_before]
    report(
        f"Prefect {kind} when the failure trigger fires",
        f"{JOBS} jobs, c={CONCURRENCY}, every job a model failure, {BRIDGES} bridges delivering the outbox",
        f"Prefect {kind} from before the trigger until {DOWN_S:g} s after it; {last.get('attempts')} refused "
        f"attempts; delivered {delivered_after:.1f} s after it returned; {len(new_runs)} flow run(s)",
        figures,
    )
    assert figures.violations() == []
    assert [run_key for _id, run_key in new_runs] == [key]
    assert [(e["idempotency_key"], e["flow_run_id"]) for e in events] == [(key, new_runs[0][0])]
    assert last["flow_run_id"] == new_runs[0][0]
    assert all(alive)
