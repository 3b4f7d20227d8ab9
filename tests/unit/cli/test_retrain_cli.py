"""`exa retrain`: input it refuses (a model not in the catalog, an alias that is not a candidate alias) is
refused before a Prefect run starts or the model's loop state is touched."""

from __future__ import annotations

import time
from typing import Any

import pytest
from typer.testing import CliRunner

from examlops.bootstrap.loop import loop_store
from examlops.cli.main import app
from examlops.core.settings import Settings
from examlops.loop.state import Phase

runner = CliRunner()


@pytest.mark.parametrize("via", [[], ["--via-prefect"]], ids=["in-process", "via-prefect"])
def test_retrain_of_a_model_not_in_the_catalog_is_not_found_and_starts_no_run(
    home: Settings, started: list[tuple[str, dict[str, Any]]], via: list[str]
) -> None:
    result = runner.invoke(app, ["retrain", "NOPE", *via])
    assert result.exit_code == 4, result.output
    assert "not in the catalog" in result.output
    assert started == []


@pytest.mark.parametrize("via", [[], ["--via-prefect"]], ids=["in-process", "via-prefect"])
def test_retrain_to_production_is_bad_input_and_leaves_the_loop_state_as_it_was(
    home: Settings, started: list[tuple[str, dict[str, Any]]], via: list[str]
) -> None:
    with loop_store(home) as store:
        store.claim("JPCP", "run-1", Phase.CANARY, time.time(), 120.0, run="flow run 1", canary_version="4")
        before = store.finish("JPCP", "run-1", Phase.PROMOTED, time.time(), note="promoted version 4")
    assert before is not None
    result = runner.invoke(app, ["retrain", "JPCP", "--alias", "Production", *via], env={"COLUMNS": "250"})
    assert result.exit_code == 2, result.output
    assert "the candidate alias must be one of Canary, Staging" in result.output
    assert started == []
    with loop_store(home) as store:
        assert store.get("JPCP") == before
        assert store.get("CRCP") is None


def test_retrain_via_prefect_starts_its_run_with_the_catalog_name_and_the_canonical_alias(
    home: Settings, started: list[tuple[str, dict[str, Any]]]
) -> None:
    result = runner.invoke(app, ["retrain", "jpcp", "--alias", "staging", "--via-prefect", "--seed", "3"])
    assert result.exit_code == 0, result.output
    [(deployment, parameters)] = started
    assert deployment == "retrain/retrain"
    assert parameters["model"] == "JPCP" and parameters["candidate_alias"] == "Staging" and parameters["seed"] == 3
