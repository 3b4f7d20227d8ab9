from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from examlops.core.setting_sources import setting_description, setting_sources
from examlops.core.settings import Settings


@pytest.mark.usefixtures("default_ports")
def test_every_seed_limit_has_the_seed_default() -> None:
    s = Settings()
    assert (s.http.connect_timeout_s, s.http.read_timeout_s) == (5.0, 10.0)
    assert (s.batch.max_size, s.batch.max_wait_ms) == (32, 50.0)
    assert s.embedding_dim == 384
    assert (s.traffic.rules_ttl_s, s.traffic.route_retries) == (30.0, 2)
    assert (s.predict.workers, s.predict.timeout_s) == (4, 30.0)
    assert (s.hotset.version_cache_size, s.hotset.reload_poll_s) == (8, 60.0)
    assert (s.failure.window, s.failure.threshold, s.failure.cooldown_s) == (50, 0.5, 300.0)
    assert s.serving.port == 18001


def test_nested_settings_come_from_double_underscore_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EXAMLOPS_PREDICT__WORKERS", "2")
    monkeypatch.setenv("EXAMLOPS_HOTSET__RELOAD_POLL_S", "0")
    s = Settings()
    assert s.predict.workers == 2
    assert s.hotset.reload_poll_s == 0


def test_every_written_path_is_under_the_state_folder(tmp_path: Path) -> None:
    s = Settings(home=tmp_path / "st")
    home = (tmp_path / "st").resolve()
    for path in (s.run_dir, s.log_dir, s.mlflow_dir, s.mlflow_artifact_root, s.prefect_home):
        assert path.is_relative_to(home)
    assert s.mlflow_tracking_uri == f"sqlite:///{home / 'mlflow' / 'mlflow.db'}"
    assert s.sql_url == f"sqlite:///{home / 'examlops.db'}"


def test_urls_point_at_external_services_when_set(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EXAMLOPS_REDIS__URL", "redis://example:6379/1")
    monkeypatch.setenv("EXAMLOPS_DATABASE_URL", "postgresql://u@h/db")
    s = Settings()
    assert s.redis_url == "redis://example:6379/1"
    assert not s.redis_owned
    assert s.sql_url == "postgresql://u@h/db"


def test_bad_values_are_refused_with_the_field_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EXAMLOPS_PREDICT__WORKERS", "0")
    with pytest.raises(ValidationError) as info:
        Settings()
    assert info.value.errors()[0]["loc"] == ("predict", "workers")


def test_production_refuses_the_development_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EXAMLOPS_ENVIRONMENT", "production")
    with pytest.raises(ValidationError, match="EXAMLOPS_SECRET"):
        Settings()
    monkeypatch.setenv("EXAMLOPS_SECRET", "a-real-secret")
    assert Settings().environment == "production"


def test_sources_say_where_each_value_came_from(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EXAMLOPS_BATCH__MAX_SIZE", "16")
    sources = {name: (value, source) for name, value, source in setting_sources(Settings())}
    assert sources["batch.max_size"] == (16, "env EXAMLOPS_BATCH__MAX_SIZE")
    assert sources["batch.max_wait_ms"] == (50.0, "default")
    assert sources["secret"][0] == "**********"


def test_every_setting_has_a_description() -> None:
    for name, _value, _source in setting_sources(Settings()):
        assert setting_description(name), name


@pytest.mark.usefixtures("default_ports")
def test_unset_locations_show_the_value_the_platform_derives_and_say_so(tmp_path: Path) -> None:
    s = Settings(home=tmp_path)
    sources = {name: (value, source) for name, value, source in setting_sources(s, environ={})}
    assert sources["mlflow.tracking_uri"] == (s.mlflow_tracking_uri, "derived from home")
    assert sources["database_url"] == (s.sql_url, "derived from home")
    assert sources["redis.url"] == ("redis://127.0.0.1:18004/0", "default (embedded, on redis.port)")
    assert sources["prefect.api_url"] == ("http://127.0.0.1:18003/api", "default (embedded, on prefect.port)")
    assert sources["catalog_dir"] == (str(s.catalog_path), "default (the demo catalog shipped with examlops)")
    assert [name for name, (value, _) in sources.items() if value is None] == []


def test_a_derived_location_follows_the_settings_it_is_derived_from(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EXAMLOPS_REDIS__PORT", "7001")
    monkeypatch.setenv("EXAMLOPS_PREFECT__API_URL", "http://prefect.example/api")
    sources = {name: (value, source) for name, value, source in setting_sources(Settings())}
    assert sources["redis.url"] == ("redis://127.0.0.1:7001/0", "default (embedded, on redis.port)")
    assert sources["prefect.api_url"] == ("http://prefect.example/api", "env EXAMLOPS_PREFECT__API_URL")


def test_config_show_never_prints_a_password_in_a_url(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EXAMLOPS_REDIS__URL", "redis://:s3cret@127.0.0.1:6379/0")
    monkeypatch.setenv("EXAMLOPS_DATABASE_URL", "postgresql+psycopg://bob:hunter2@db:5432/examlops")
    shown = {name: value for name, value, _source in setting_sources(Settings())}
    assert shown["redis.url"] == "redis://:**********@127.0.0.1:6379/0"
    assert shown["database_url"] == "postgresql+psycopg://bob:**********@db:5432/examlops"
    assert "s3cret" not in repr(shown) and "hunter2" not in repr(shown)
