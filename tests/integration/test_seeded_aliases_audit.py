"""The aliases `exa up` seeds are on the audit trail, so `exa audit verify` sees them moved outside examlops; an
alias no event names is listed as not covered by the trail, without failing. Real Redis, a real SQLite MLflow
store in the test's folder, the CLI through typer's CliRunner."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import redis
from typer.testing import CliRunner

from examlops.bootstrap import prepare_platform, upgrade_database
from examlops.bootstrap.control import audit_access
from examlops.cli.audit import audit_app
from examlops.core.settings import Settings
from examlops.monitoring.audit import ALIAS_MOVE_INTENDED, ALIAS_MOVED
from examlops.monitoring.audit.verified import last_verify
from examlops.monitoring.audit.verify import tail
from tests.ports import free_port

pytestmark = [
    pytest.mark.integration,
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::FutureWarning"),
]

SEEDED = {(model, alias) for model in ("AC", "CRCP", "JPCP") for alias in ("Production", "Canary", "Staging")}


def test_an_outside_move_of_an_alias_exa_up_seeded_fails_verify_and_an_alias_never_audited_is_listed(
    client: redis.Redis, redis_server: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")
    monkeypatch.chdir(tmp_path)  # anything MLflow drops in the working directory lands in the temp folder
    settings = Settings(home=tmp_path / "state", redis={"url": redis_server})
    upgrade_database(settings)  # as `exa up` does first
    prepare_platform(settings)  # what `exa up` runs once Redis is up

    with audit_access(settings) as access:
        events = tail(access.store, 500)
    moves = [json.loads(e.data) for e in events if e.type in (ALIAS_MOVE_INTENDED, ALIAS_MOVED)]
    assert [e.type for e in events if e.type in (ALIAS_MOVE_INTENDED, ALIAS_MOVED)] == [
        ALIAS_MOVE_INTENDED,
        ALIAS_MOVED,
    ] * len(SEEDED)  # each seeded alias: its intent, then its outcome
    assert {(m["model"], m["alias"]) for m in moves} == SEEDED
    assert {(m["actor"], m["by"]) for m in moves} == {("system:exa-up", "demo seed")}

    env = {"EXAMLOPS_HOME": str(settings.home), "EXAMLOPS_REDIS__URL": redis_server}
    runner = CliRunner()
    result = runner.invoke(audit_app, ["verify", "--json"], env=env)
    assert result.exit_code == 0, result.output
    verified = json.loads(result.stdout)
    assert verified["aliases_unaccounted"] == [] and verified["aliases_not_covered"] == []

    from mlflow import MlflowClient

    mlflow = MlflowClient(tracking_uri=settings.mlflow_tracking_uri, registry_uri=settings.mlflow_tracking_uri)
    mlflow.set_registered_model_alias("JPCP", "Shadow", "1")  # an alias examlops never pointed
    result = runner.invoke(audit_app, ["verify"], env=env)
    assert result.exit_code == 0, result.output  # nothing says it is wrong: listed, not failed
    assert "audit trail intact" in result.output and "not covered by the trail" in result.output
    assert "JPCP@Shadow -> 1" in result.output

    # The operator audit's moves, made directly in MLflow.
    mlflow.set_registered_model_alias("CRCP", "Production", "2")
    mlflow.set_registered_model_alias("JPCP", "Staging", "1")
    result = runner.invoke(audit_app, ["verify", "--json"], env=env)
    assert result.exit_code == 1, result.output
    verified = json.loads(result.stdout)
    assert verified["ok"] is True  # the chain itself is whole: what fails is the aliases
    found = sorted(verified["aliases_unaccounted"])
    assert len(found) == 2 and found[0].startswith("CRCP@Production: ") and found[1].startswith("JPCP@Staging: ")
    assert "the registry has 2" in found[0] and "the registry has 1" in found[1]
    assert verified["aliases_not_covered"] == [{"model": "JPCP", "alias": "Shadow", "version": "1"}]
    result = runner.invoke(audit_app, ["verify"], env=env)
    assert result.exit_code == 1 and "alias move not accounted for" in result.output

    with audit_access(settings) as access:  # what the dashboard shows: the same findings and the same list
        stored = last_verify(access.store.redis, access.secret)
    assert stored is not None and not stored.ok and sorted(stored.problems) == found
    assert stored.notes == ("not covered by the trail: JPCP@Shadow -> 1",)


def test_exa_demo_seed_with_redis_down_exits_3_before_it_registers_anything(tmp_path: Path) -> None:
    from examlops.cli.main import app

    settings = Settings(home=tmp_path / "state")
    upgrade_database(settings)
    env = {"EXAMLOPS_HOME": str(settings.home), "EXAMLOPS_REDIS__URL": f"redis://127.0.0.1:{free_port()}/0"}
    result = CliRunner().invoke(app, ["demo", "seed", "--json"], env=env)
    assert result.exit_code == 3, result.output
    assert "Redis cannot be reached" in result.output and "nothing was seeded" in result.output
    assert not settings.mlflow_dir.exists() or not any(settings.mlflow_dir.iterdir())
