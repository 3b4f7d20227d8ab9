"""Direct HTTP calls skip the bus and write no drift snapshot and no ``inference.served`` event (seed 000, step 12).

Serving runs for real (uvicorn, models from a real MLflow store) against the session's redis-server, the
Redis where the bridge records. A control action of serving (a traffic change) lands in that Redis's audit
trail, so the test sees that serving does write there: it would see a record too, if serving wrote one.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest
import redis

from examlops.core.settings import Settings
from examlops.monitoring.audit import INFERENCE_SERVED, STREAM, TRAFFIC_CHANGED
from examlops.monitoring.snapshots import MODELS, PREFIX
from examlops.registry.catalog import load_catalog
from examlops.registry.demo import seed_demo
from tests.integration.servers import ServingProcess

pytestmark = [
    pytest.mark.integration,
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::UserWarning"),
    pytest.mark.filterwarnings("ignore::FutureWarning"),
]


@pytest.fixture(scope="module")
def serving(tmp_path_factory: pytest.TempPathFactory, redis_server: str) -> Iterator[ServingProcess]:
    home = tmp_path_factory.mktemp("direct")
    settings = Settings(home=home)
    seed_demo(settings, load_catalog(settings.catalog_path))
    proc = ServingProcess(
        home,
        env={
            "EXAMLOPS_REDIS__URL": redis_server,
            "EXAMLOPS_PREDICT__WORKERS": "1",
            "EXAMLOPS_HOTSET__RELOAD_POLL_S": "0",
        },
    )
    try:
        proc.wait_ready()
        yield proc
    finally:
        code = proc.stop()
        assert code == 0, proc.log_tail()


def body(seed: int, **extra: Any) -> dict[str, Any]:
    embedding = [float(v) for v in np.random.default_rng(seed).normal(0, 0.05, 384)]
    return {"embedding": embedding, "node_count": 12, **extra}


def snapshot_keys(client: redis.Redis) -> list[str]:
    return sorted(str(key) for key in client.scan_iter(match=PREFIX + "*"))


def audit_types(client: redis.Redis) -> list[str]:
    entries: Any = client.xrange(STREAM)
    return [fields["type"] for _, fields in entries]


def test_direct_predictions_write_no_snapshot_and_no_served_event(serving: ServingProcess, client: redis.Redis) -> None:
    answered = 0
    for i, model in enumerate(("JPCP", "crcp", "AC")):
        direct = httpx.post(f"{serving.url}/v1/models/{model}/predict", json=body(i), timeout=30, headers=serving.auth)
        piped = httpx.post(
            f"{serving.url}/infer-pipeline/infer",
            json=body(i, model=model, job_id=f"j{i}"),
            timeout=30,
            headers=serving.auth,
        )
        canary = httpx.post(
            f"{serving.url}/v1/models/{model}/predict", json=body(i, alias="Canary"), timeout=30, headers=serving.auth
        )
        answered += sum(reply.status_code == 200 for reply in (direct, piped, canary))
    # The demo's Staging version fails on purpose: a failure the bridge would record too.
    failed = httpx.post(
        f"{serving.url}/infer-pipeline/infer",
        json=body(9, model="JPCP", alias="Staging"),
        timeout=30,
        headers=serving.auth,
    )
    assert (answered, failed.status_code) == (9, 500), failed.text

    # Serving does write to this Redis: its control actions go to the audit trail there.
    assert (
        httpx.put(
            f"{serving.url}/v1/traffic/JPCP", json={"Production": 100}, timeout=30, headers=serving.auth
        ).status_code
        == 200
    )
    assert TRAFFIC_CHANGED in audit_types(client)

    assert INFERENCE_SERVED not in audit_types(client)
    assert snapshot_keys(client) == []
    assert not client.exists(MODELS)
