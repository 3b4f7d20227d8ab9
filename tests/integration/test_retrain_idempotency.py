"""A retrain request delivered twice makes one flow run, against a real Prefect server (prefect_test_harness).

The retrain deployment is the one of ``prefect.yaml``, registered but not served, so its runs stay
scheduled and the test counts them. The request goes through the bridge's real path: the Redis outbox
on the session's redis-server, ``OutboxDelivery`` and ``PrefectRetrainRequester``.
"""

from __future__ import annotations

from collections.abc import Iterator
from uuid import UUID

import pytest
import redis

from examlops.monitoring.retrain import (
    DEFAULT_DEPLOYMENT,
    OutboxDelivery,
    PrefectRetrainRequester,
    RedisOutbox,
    RetrainRequest,
)

pytestmark = [
    pytest.mark.integration,
    # Prefect's and MLflow's own deprecations, not ours.
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::FutureWarning"),
    pytest.mark.filterwarnings("ignore::UserWarning"),
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
]


@pytest.fixture(scope="module")
def prefect_api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The API URL of one prefect_test_harness (15-30 s) whose files stay in the temp folder."""
    root = tmp_path_factory.mktemp("prefect")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PREFECT_HOME", str(root / "prefect"))
        mp.setenv("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
        mp.setenv("MLFLOW_DISABLE_TELEMETRY", "true")
        mp.chdir(root)
        from prefect.settings import PREFECT_API_URL
        from prefect.testing.utilities import prefect_test_harness

        with prefect_test_harness(server_startup_timeout=90):
            url = PREFECT_API_URL.value()
            assert url, "the harness set no API URL"
            yield str(url)


def register_retrain_deployment() -> UUID:
    """The retrain deployment of prefect.yaml, registered (not served); its id."""
    from examlops.flows.deployments import default_path, load_deployments

    [deployment] = [d for d in load_deployments(default_path()) if d.name == "retrain"]
    assert f"{deployment.flow_name}/{deployment.name}" == DEFAULT_DEPLOYMENT
    deployment_id: UUID = deployment.apply()
    return deployment_id


def test_a_request_delivered_twice_makes_exactly_one_flow_run(prefect_api: str, client: redis.Redis) -> None:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId

    deployment_id = register_retrain_deployment()
    outbox = RedisOutbox(client)
    delivery = OutboxDelivery(outbox, PrefectRetrainRequester(prefect_api))
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
