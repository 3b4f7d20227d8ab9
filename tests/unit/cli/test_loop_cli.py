from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from examlops.bootstrap import upgrade_database
from examlops.bootstrap.loop import loop_store
from examlops.cli.main import app
from examlops.core.settings import Settings
from examlops.loop.state import Phase

runner = CliRunner()


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Settings:
    monkeypatch.setenv("EXAMLOPS_HOME", str(tmp_path))
    settings = Settings(home=tmp_path)
    upgrade_database(settings)
    return settings


def test_loop_status_shows_every_catalog_model_and_a_running_canary_with_its_figures(home: Settings) -> None:
    figures = {
        "canary": {"requests": 42, "failure_rate": 0.0, "p99_ms": 12.5},
        "production": {"requests": 380, "failure_rate": 0.01, "p99_ms": 11.0},
    }
    with loop_store(home) as store:
        store.claim("JPCP", "run-1", Phase.CANARY, time.time(), 120.0, share=10, canary_version="4",
                    production_version="1", figures=figures, run="flow run 1", note="watching")  # fmt: skip
    result = runner.invoke(app, ["loop", "status", "--json"])
    assert result.exit_code == 0, result.output
    rows = {row["model"]: row for row in json.loads(result.stdout)}
    assert set(rows) == {"JPCP", "CRCP", "AC"}
    assert rows["CRCP"]["phase"] == "serving"
    assert rows["JPCP"]["phase"] == "canary" and rows["JPCP"]["share"] == 10 and not rows["JPCP"]["stale"]
    assert rows["JPCP"]["figures"]["canary"]["requests"] == 42
    table = runner.invoke(app, ["loop", "status", "jpcp"], env={"COLUMNS": "250"})
    assert table.exit_code == 0 and "canary at 10 %" in table.output and "Canary 42 calls" in table.output


def test_canary_abort_without_a_running_loop_is_not_found(home: Settings) -> None:
    result = runner.invoke(app, ["canary", "abort", "AC"])
    assert result.exit_code == 4, result.output
    assert "no loop holds AC" in result.output


def test_loop_status_of_an_unknown_model_is_not_found(home: Settings) -> None:
    assert runner.invoke(app, ["loop", "status", "nope"]).exit_code == 4
