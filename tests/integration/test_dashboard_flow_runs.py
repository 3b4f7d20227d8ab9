"""The dashboard's Prefect source against a real Prefect server (``prefect_test_harness``): a model's page lists
the flow runs whose parameters name it (a drift report without ``models`` names every model), each linked to
its page in the Prefect UI, and no other model's, nor a run scheduled for later."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from examlops.bootstrap.dashboard import _FlowRuns

pytestmark = [
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
]


@pytest.fixture
def prefect_api(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    monkeypatch.setenv("PREFECT_HOME", str(tmp_path / "prefect"))
    monkeypatch.setenv("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    monkeypatch.chdir(tmp_path)
    from prefect.settings import PREFECT_API_URL
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=90):
        yield str(PREFECT_API_URL.value())


def test_a_model_lists_the_runs_whose_parameters_name_it(prefect_api: str) -> None:
    from prefect import flow
    from prefect.client.orchestration import get_client
    from prefect.states import Scheduled

    @flow(name="promote")
    def promote(model: str, alias: str = "Production") -> str:
        return model

    @flow(name="drift-report")
    def drift_report(models: list[str] | None = None) -> int:
        return len(models or [])

    @flow(name="unrelated")
    def unrelated(model: str) -> str:
        return model

    promote("JPCP")
    promote("AC")
    drift_report(["JPCP", "AC"])
    drift_report(["AC"])
    unrelated("JPCP")
    drift_report()  # the scheduled run: no models, so every model's
    with get_client(sync_client=True) as client:  # the next scheduled report has not happened: not listed
        client.create_flow_run(drift_report, state=Scheduled(scheduled_time=datetime.now(UTC) + timedelta(hours=1)))
    runs = _FlowRuns(prefect_api.removesuffix("/")).runs("JPCP", 10)
    assert sorted(r.flow for r in runs) == ["drift-report", "drift-report", "promote"]
    ui = prefect_api.removesuffix("/").removesuffix("/api")
    assert all(r.url == f"{ui}/runs/flow-run/{r.id}" and r.state == "Completed" and r.started_at for r in runs)
    assert [r.flow for r in _FlowRuns(prefect_api).runs("AC", 1)] == ["drift-report"]  # the newest, unnamed one
    assert len(_FlowRuns(prefect_api).runs("AC", 10)) == 4
