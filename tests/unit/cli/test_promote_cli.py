"""`exa promote` and `exa rollback` on what they refuse or skip before MLflow, Redis or a serving instance is
reached: their exit codes and what they print."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from examlops.bootstrap import upgrade_database
from examlops.cli.main import app
from examlops.core.settings import Settings
from examlops.promotion import service
from examlops.promotion.service import PromotionResult

runner = CliRunner()


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Settings:
    monkeypatch.setenv("EXAMLOPS_HOME", str(tmp_path))
    monkeypatch.setenv("COLUMNS", "250")  # one message per line
    settings = Settings(home=tmp_path)
    upgrade_database(settings)
    return settings


@pytest.mark.parametrize(
    "args",
    [
        ["promote", "JPCP", "--alias", "Bogus", "--from", "Canary"],
        ["promote", "JPCP", "--alias", "Production", "--from", "Bogus"],
        ["rollback", "JPCP", "--alias", "Bogus"],
    ],
)
def test_an_alias_serving_does_not_load_exits_2_naming_those_it_does_before_mlflow_is_opened(
    home: Settings, args: list[str]
) -> None:
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    assert "serving loads the aliases Production, Canary, Staging of JPCP: 'Bogus' is none of them" in result.output
    assert not (home.mlflow_dir / "mlflow.db").exists()  # the registry was never asked


@pytest.mark.parametrize("args", [["promote", "NOPE", "--alias", "Production", "--version", "1"], ["rollback", "nope"]])
def test_a_model_not_in_the_catalog_exits_4_with_the_catalog_message(home: Settings, args: list[str]) -> None:
    result = runner.invoke(app, args)
    assert result.exit_code == 4, result.output
    assert "is not in the catalog (known: AC, CRCP, JPCP)" in result.output
    assert not (home.mlflow_dir / "mlflow.db").exists()


def test_a_promotion_that_moved_nothing_says_so_and_names_the_instances_serving_it(
    home: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = "http://127.0.0.1:18001"
    said = PromotionResult("AC", "Production", "1", "1", (url,), nothing_to_do=True)  # the service's word
    monkeypatch.setattr(service, "promote", lambda *args, **kwargs: said)
    text = runner.invoke(app, ["promote", "ac", "--alias", "production", "--version", "1"])
    assert text.exit_code == 0, text.output
    assert "AC@Production: already at version 1, nothing moved; 1 instance(s) serve it" in text.output
    as_json = runner.invoke(app, ["promote", "AC", "--alias", "Production", "--version", "1", "--json"])
    assert as_json.exit_code == 0, as_json.output
    assert json.loads(as_json.stdout) == {
        "model": "AC",
        "alias": "Production",
        "old_version": "1",
        "new_version": "1",
        "instances": [url],
        "unaccounted": None,
        "warnings": [],
        "nothing_to_do": True,
    }
