"""`exa drift status` and `exa drift input status` after a real drift report, through typer's CliRunner.

Snapshots go to the session's redis-server as the bridge writes them, the report runs for real
(`exa drift report`: Evidently against the Production version's training reference from a seeded MLflow
store, a status row in SQL), then both status commands read what it wrote.
"""

from __future__ import annotations

import json
import zlib
from pathlib import Path
from typing import Any

import pytest
import redis
from typer.testing import CliRunner

from examlops.bootstrap import upgrade_database
from examlops.cli.main import app as exa
from examlops.core.settings import Settings
from examlops.registry.catalog import load_catalog
from examlops.registry.demo import seed_demo
from examlops.registry.mlflow_registry import MlflowRegistry
from tests.integration.test_flows import Plane, add_snapshots

pytestmark = [
    pytest.mark.integration,
    # Evidently's and MLflow's own deprecations, not ours.
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::FutureWarning"),
    pytest.mark.filterwarnings("ignore::UserWarning"),
]

runner = CliRunner()


@pytest.fixture
def plane(tmp_path: Path, redis_server: str, client: redis.Redis, monkeypatch: pytest.MonkeyPatch) -> Plane:
    """A seeded state folder and an empty Redis; `exa` reads both from the environment."""
    home = tmp_path / "state"
    env = {"EXAMLOPS_HOME": str(home), "EXAMLOPS_REDIS__URL": redis_server}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    # `exa` sets these for itself when unset; set here, the test's end restores them.
    monkeypatch.setenv("PREFECT_HOME", str(home / "prefect"))
    monkeypatch.setenv("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")
    monkeypatch.chdir(tmp_path)
    settings = Settings(home=home, redis={"url": redis_server})
    seed_demo(settings, load_catalog(settings.catalog_path))
    upgrade_database(settings)  # as `exa up` does first
    return Plane(home, env, settings, MlflowRegistry(settings.mlflow_tracking_uri, home / "cache"), client)


def exa_json(*args: str) -> Any:
    result = runner.invoke(exa, [*args, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_drift_status_and_input_status_report_each_model_after_a_drift_report(plane: Plane) -> None:
    assert exa_json("drift", "status") == []
    add_snapshots(plane, "JPCP", 600, seed=zlib.crc32(b"moved"), shift=1.0)
    add_snapshots(plane, "CRCP", 600, seed=zlib.crc32(b"same"), shift=0.0)

    reported = {row["model"]: row for row in exa_json("drift", "report")}
    assert reported["JPCP"]["prediction_drift"] is True and reported["CRCP"]["prediction_drift"] is False
    assert reported["AC"]["reported"] is False  # no snapshots of AC: no report, no status row

    for command, kind in ((("drift", "status"), "prediction"), (("drift", "input", "status"), "input")):
        rows = {row["model"]: row for row in exa_json(*command)}
        assert set(rows) == {"JPCP", "CRCP"}, command
        for model, row in rows.items():
            assert row["kind"] == kind and row["method"] == "ks" and row["current_rows"] == 600
            assert row["drifted"] is reported[model][f"{kind}_drift"]
            assert round(row["score"], 6) == reported[model][f"{kind}_score"]  # the report prints 6 places
            assert Path(row["report_html"]).is_file()
        assert rows["JPCP"]["drifted"] is True and rows["JPCP"]["score"] < 0.05
        assert rows["CRCP"]["drifted"] is False

    table = runner.invoke(exa, ["drift", "status"])
    assert table.exit_code == 0, table.output
    assert "JPCP" in table.output and "DRIFT" in table.output and "CRCP" in table.output
