"""The `exa` command line through typer's CliRunner: help, settings, input errors, exit codes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from examlops.cli.main import app
from tests.ports import free_port

runner = CliRunner()


def test_help_lists_every_command_group_with_its_purpose() -> None:
    result = runner.invoke(app, ["--help"])
    assert result.exit_code == 0
    for group in ("config", "demo", "serve", "predict", "up", "down", "status"):
        assert group in result.output


@pytest.mark.usefixtures("default_ports")
def test_config_show_json_gives_each_value_and_its_source(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EXAMLOPS_PREDICT__TIMEOUT_S", "12.5")
    result = runner.invoke(app, ["config", "show", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["predict.timeout_s"] == {"value": 12.5, "source": "env EXAMLOPS_PREDICT__TIMEOUT_S"}
    assert data["traffic.rules_ttl_s"] == {"value": 30.0, "source": "default"}
    assert data["serving.port"]["value"] == 18001


@pytest.mark.usefixtures("default_ports")
def test_config_show_gives_derived_locations_their_effective_value_and_source(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EXAMLOPS_HOME", str(tmp_path))
    monkeypatch.setenv("COLUMNS", "400")  # rich reads it on each print: one line per row
    home = tmp_path.resolve()
    data = json.loads(runner.invoke(app, ["config", "show", "--json"]).stdout)
    assert data["mlflow.tracking_uri"] == {"value": f"sqlite:///{home}/mlflow/mlflow.db", "source": "derived from home"}
    assert data["database_url"] == {"value": f"sqlite:///{home}/examlops.db", "source": "derived from home"}
    assert data["redis.url"]["value"] == "redis://127.0.0.1:18004/0"
    assert data["prefect.api_url"]["value"] == "http://127.0.0.1:18003/api"
    assert [name for name, row in data.items() if row["value"] is None] == []

    table = runner.invoke(app, ["config", "show"])
    assert table.exit_code == 0, table.output
    assert "null" not in table.output
    [row] = [line for line in table.output.splitlines() if " mlflow.tracking_uri " in line]
    assert f"sqlite:///{home}/mlflow/mlflow.db" in row and "derived from home" in row
    [row] = [line for line in table.output.splitlines() if " redis.url " in line]
    assert "redis://127.0.0.1:18004/0" in row and "default (embedded, on redis.port)" in row


def test_config_show_table_explains_each_setting() -> None:
    result = runner.invoke(app, ["config", "show"])
    assert result.exit_code == 0
    assert "predict.workers" in result.output


def test_an_invalid_setting_is_a_clear_error_with_exit_2(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EXAMLOPS_BATCH__MAX_SIZE", "zero")
    result = runner.invoke(app, ["config", "show"])
    assert result.exit_code == 2
    assert "batch.max_size" in result.output


def test_predict_needs_exactly_one_embedding_source() -> None:
    result = runner.invoke(app, ["predict", "JPCP", "--node-count", "3"])
    assert result.exit_code == 2
    assert "--embedding-file" in result.output


def test_predict_with_an_unreadable_embedding_file_is_exit_2(tmp_path: Path) -> None:
    bad = tmp_path / "e.json"
    bad.write_text("not numbers at all")
    result = runner.invoke(app, ["predict", "JPCP", "--node-count", "3", "--embedding-file", str(bad)])
    assert result.exit_code == 2


def test_an_unreachable_server_is_exit_3_with_its_url() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    result = runner.invoke(app, ["serve", "check", "--url", url])
    assert result.exit_code == 3
    assert url in result.output


@pytest.mark.parametrize("url", ["notaurl", "ftp://127.0.0.1:18001", "http://"])
@pytest.mark.parametrize(
    "command",
    [
        ["serve", "check"],
        ["jobs", "list"],
        ["predict", "JPCP", "--random", "--node-count", "3"],
        ["promote", "JPCP", "--alias", "Production", "--version", "1", "--url", "http://127.0.0.1:18001"],
    ],
)
def test_a_url_that_is_not_http_with_a_host_is_exit_2_naming_it(command: list[str], url: str) -> None:
    result = runner.invoke(app, [*command, "--url", url])
    assert result.exit_code == 2 and "Invalid value for '--url'" in result.output


def test_traffic_without_a_server_is_exit_3_never_a_traceback() -> None:
    result = runner.invoke(app, ["serve", "traffic", "NOPE", "--url", f"http://127.0.0.1:{free_port()}"])
    assert result.exit_code == 3
    assert "Traceback" not in result.output


def test_traffic_clear_with_a_weight_is_exit_2_naming_the_conflict_before_any_request() -> None:
    url = f"http://127.0.0.1:{free_port()}"  # nobody listens: a request would be exit 3
    result = runner.invoke(app, ["serve", "traffic", "JPCP", "--clear", "--production", "100", "--url", url])
    assert result.exit_code == 2, result.output
    assert "--clear removes the split but --production 100 sets one" in " ".join(result.output.split())


def test_a_bridge_for_a_model_not_in_the_catalog_is_refused_before_it_starts() -> None:
    result = runner.invoke(app, ["bridge", "start", "--model", "JPCP", "--model", "nope"])
    assert result.exit_code == 4
    assert "'nope'" in result.output and "known: " in result.output


def test_bridge_start_help_explains_model() -> None:
    result = runner.invoke(app, ["bridge", "start", "--help"])
    assert result.exit_code == 0
    assert "--model" in result.output and "model_not_found" in result.output


def test_config_show_never_prints_the_token_and_shouts_when_authentication_is_off(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EXAMLOPS_HOME", str(tmp_path))
    monkeypatch.setenv("COLUMNS", "400")
    monkeypatch.setenv("EXAMLOPS_TOKEN", "exa_0123456789abcdef_" + "s" * 43)
    monkeypatch.setenv("EXAMLOPS_AUTH__ENABLED", "false")
    shown = runner.invoke(app, ["config", "show"])
    as_json = runner.invoke(app, ["config", "show", "--json"])
    assert shown.exit_code == 0 and as_json.exit_code == 0
    assert "s" * 43 not in shown.output + as_json.output
    assert json.loads(as_json.stdout)["token"]["value"] == "**********"
    assert "AUTHENTICATION IS OFF" in shown.output.splitlines()[0]


def test_authentication_off_is_refused_outside_development(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EXAMLOPS_HOME", str(tmp_path))
    monkeypatch.setenv("EXAMLOPS_ENVIRONMENT", "production")
    monkeypatch.setenv("EXAMLOPS_SECRET", "a-real-secret-for-this-test")
    monkeypatch.setenv("EXAMLOPS_AUTH__ENABLED", "false")
    result = runner.invoke(app, ["config", "show"])
    assert result.exit_code == 2
    assert "EXAMLOPS_AUTH__ENABLED=false is allowed only when" in " ".join(result.output.split())


def test_an_error_message_prints_its_brackets_as_text(capsys: pytest.CaptureFixture[str]) -> None:
    import typer

    from examlops.cli.output import fail

    with pytest.raises(typer.Exit) as exited:
        fail("the Ray engine needs the ray extra: pip install 'examlops[ray]'", 3)
    assert exited.value.exit_code == 3
    assert "pip install 'examlops[ray]'" in capsys.readouterr().err
