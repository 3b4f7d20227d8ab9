from __future__ import annotations

import json
import time
from typing import Any

import pytest
from typer.testing import CliRunner

from examlops.bootstrap.loop import loop_store
from examlops.cli.main import app
from examlops.core.errors import RegistryUnavailable
from examlops.core.settings import Settings
from examlops.loop.ports import Versions
from examlops.loop.state import Phase
from tests.unit.loop.fakes import FakeVersions

runner = CliRunner()


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


def test_loop_status_says_since_when_a_phase_runs_not_when_it_was_last_updated(home: Settings) -> None:
    now = time.time()
    with loop_store(home) as store:
        store.claim("JPCP", "run-1", Phase.RETRAINING, now - 100, 120.0, run="flow run 1", started_at=now - 100)
        store.update("JPCP", "run-1", now - 2, note="training")
    table = runner.invoke(app, ["loop", "status", "JPCP"], env={"COLUMNS": "250"})
    assert table.exit_code == 0 and "100 s ago" in table.output and " 2 s ago" not in table.output


def test_canary_abort_without_a_running_loop_is_not_found(home: Settings) -> None:
    result = runner.invoke(app, ["canary", "abort", "AC"])
    assert result.exit_code == 4, result.output
    assert "no loop holds AC" in result.output


def test_loop_status_of_an_unknown_model_is_not_found(home: Settings) -> None:
    assert runner.invoke(app, ["loop", "status", "nope"]).exit_code == 4


def _registry(monkeypatch: pytest.MonkeyPatch, versions: Versions) -> None:
    monkeypatch.setattr("examlops.bootstrap.loop.model_versions", lambda settings: versions)


def test_canary_start_of_a_model_not_in_the_catalog_is_not_found_and_starts_no_run(
    home: Settings, started: list[tuple[str, dict[str, Any]]], monkeypatch: pytest.MonkeyPatch
) -> None:
    _registry(monkeypatch, FakeVersions())
    for args in (["canary", "start", "NOPE"], ["canary", "start", "NOPE", "--here"]):
        result = runner.invoke(app, args)
        assert result.exit_code == 4, result.output
        assert "not in the catalog" in result.output
    assert started == []


@pytest.mark.parametrize(
    ("aliases", "why"),
    [({"Production": "3", "Canary": "3"}, "both version 3"), ({"Production": "3"}, "Canary is not set")],
)
def test_canary_start_with_nothing_to_analyse_is_refused_before_a_run_starts(
    home: Settings,
    started: list[tuple[str, dict[str, Any]]],
    monkeypatch: pytest.MonkeyPatch,
    aliases: dict[str, str],
    why: str,
) -> None:
    _registry(monkeypatch, FakeVersions(aliases))
    result = runner.invoke(app, ["canary", "start", "JPCP"], env={"COLUMNS": "250"})
    assert result.exit_code == 2, result.output
    assert why in result.output and "nothing to analyse" in result.output
    assert started == []
    with loop_store(home) as store:
        assert store.get("JPCP") is None


def test_canary_start_when_the_registry_is_unavailable_exits_3_and_starts_no_run(
    home: Settings, started: list[tuple[str, dict[str, Any]]], monkeypatch: pytest.MonkeyPatch
) -> None:
    class Down:
        def version(self, model: str, alias: str) -> str:
            raise RegistryUnavailable("MLflow at http://127.0.0.1:1 cannot be reached")

    _registry(monkeypatch, Down())
    result = runner.invoke(app, ["canary", "start", "JPCP"])
    assert result.exit_code == 3, result.output
    assert started == []


def test_canary_start_of_a_canary_to_analyse_starts_a_run_for_the_catalog_name(
    home: Settings, started: list[tuple[str, dict[str, Any]]], monkeypatch: pytest.MonkeyPatch
) -> None:
    _registry(monkeypatch, FakeVersions({"Production": "1", "Canary": "2"}))
    result = runner.invoke(app, ["canary", "start", "jpcp", "--share", "5"])
    assert result.exit_code == 0, result.output
    assert started == [("canary-analysis/canary-analysis", {"model": "JPCP", "share": 5})]


@pytest.mark.parametrize(("silent_s", "refused"), [(5.0, True), (500.0, False)], ids=["live", "dead"])
def test_canary_start_while_a_live_run_holds_the_model_exits_1_naming_it_and_starts_no_run(
    home: Settings,
    started: list[tuple[str, dict[str, Any]]],
    monkeypatch: pytest.MonkeyPatch,
    silent_s: float,
    refused: bool,
) -> None:
    _registry(monkeypatch, FakeVersions({"Production": "1", "Canary": "2"}))
    at = time.time() - silent_s  # a run silent past the lease (120 s) is dead: the next run ends its hold
    with loop_store(home) as store:
        store.claim("JPCP", "run-1", Phase.RETRAINING, at, 120.0, run="flow run 7", started_at=at)
    for command in (["canary", "start", "JPCP"], ["retrain", "JPCP", "--via-prefect"]):
        result = runner.invoke(app, command, env={"COLUMNS": "250"})
        assert (result.exit_code, "a loop is running" in result.output) == ((1, True) if refused else (0, False))
        assert refused == ("flow run 7" in result.output)
    assert len(started) == (0 if refused else 2)
