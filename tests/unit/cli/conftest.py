"""Fixtures of the CLI's unit tests: a state folder with its database, and Prefect runs recorded, not started."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from examlops.bootstrap import upgrade_database
from examlops.core.settings import Settings


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Settings:
    monkeypatch.setenv("EXAMLOPS_HOME", str(tmp_path))
    settings = Settings(home=tmp_path)
    upgrade_database(settings)
    return settings


@pytest.fixture
def started(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, dict[str, Any]]]:
    """Every Prefect run the CLI starts (deployment, parameters), recorded instead of started."""
    runs: list[tuple[str, dict[str, Any]]] = []

    def start_run(settings: Settings, deployment: str, parameters: dict[str, Any], **_: Any) -> None:
        runs.append((deployment, parameters))

    monkeypatch.setattr("examlops.cli.deployments.start_run", start_run)
    return runs
