"""`exa bus send` through typer's CliRunner: a model or a task, and what it says when neither works."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from examlops.bootstrap import upgrade_database
from examlops.cli.main import app
from examlops.core.settings import Settings

runner = CliRunner()


def test_bus_send_takes_exactly_one_of_a_model_and_a_task() -> None:
    both = runner.invoke(app, ["bus", "send", "JPCP", "--task", "t", "--random", "--node-count", "3"])
    neither = runner.invoke(app, ["bus", "send", "--random", "--node-count", "3"])
    assert both.exit_code == neither.exit_code == 2
    assert "exactly one of a MODEL and --task" in both.output


def test_bus_send_to_a_task_that_is_not_mapped_is_not_found(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EXAMLOPS_HOME", str(tmp_path))
    upgrade_database(Settings(home=tmp_path))  # an empty task map
    result = runner.invoke(app, ["bus", "send", "--task", "no.such.task", "--random", "--node-count", "3"])
    assert result.exit_code == 4, result.output
    assert "no.such.task" in result.output


def test_bus_send_without_a_token_says_where_one_comes_from(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EXAMLOPS_HOME", str(tmp_path))
    result = runner.invoke(app, ["bus", "send", "JPCP", "--random", "--node-count", "3", "--json"])
    assert result.exit_code != 0
    assert "EXAMLOPS_TOKEN" in " ".join(result.output.split())


def test_config_show_masks_the_token(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EXAMLOPS_HOME", str(tmp_path))
    monkeypatch.setenv("EXAMLOPS_TOKEN", "exa_0123abcd4567ef89_" + "s" * 43)
    result = runner.invoke(app, ["config", "show", "--json"])
    assert result.exit_code == 0, result.output
    assert "s" * 43 not in result.output and json.loads(result.stdout)["token"]["value"] == "**********"
