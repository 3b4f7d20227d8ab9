"""MlflowRegistry against a real temporary SQLite MLflow store, seeded once for the module."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import examlops.registry.mlflow_registry as mlflow_registry
from examlops.core.errors import AliasNotFound, ConfigError, ModelNotFound, RegistryUnavailable, VersionNotFound
from examlops.core.settings import Settings
from examlops.registry.catalog import load_catalog
from examlops.registry.demo import seed_demo
from examlops.registry.loader import expected_features, load_sklearn_model
from examlops.registry.mlflow_registry import MlflowRegistry
from examlops.registry.synthetic import feature_count, features, make_dataset
from tests.ports import free_port

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MlflowRegistry]:
    root = tmp_path_factory.mktemp("registry")
    (root / "state").mkdir()
    (root / "cwd").mkdir()
    with pytest.MonkeyPatch.context() as mp:
        for name in list(os.environ):
            if name.startswith("EXAMLOPS_"):
                mp.delenv(name)
        mp.chdir(root / "cwd")
        settings = Settings(home=root / "state")
        seed_demo(settings, load_catalog(settings.catalog_path))
        yield MlflowRegistry(settings.mlflow_tracking_uri, settings.state_dir / "cache")
        assert list((root / "cwd").iterdir()) == [], "MLflow wrote into the working directory"


def test_resolve_matches_alias_and_model_name_case_insensitively(registry: MlflowRegistry) -> None:
    assert registry.resolve("jpcp", "production").version == "1"
    canary = registry.resolve("JPCP", "CANARY")
    assert (canary.name, canary.version) == ("JPCP", "2")
    assert canary.run_id and canary.source


def test_aliases_are_keyed_by_canonical_name(registry: MlflowRegistry) -> None:
    aliases = registry.aliases("crcp")
    assert {alias: ref.version for alias, ref in aliases.items()} == {"Production": "1", "Canary": "2", "Staging": "3"}


def test_unknown_model_alias_and_version_raise_our_errors(registry: MlflowRegistry) -> None:
    with pytest.raises(ModelNotFound):
        registry.resolve("NOPE", "Production")
    with pytest.raises(ModelNotFound):
        registry.list_versions("NOPE")
    with pytest.raises(AliasNotFound):
        registry.resolve("JPCP", "Nightly")
    for version in ("99", "abc"):
        with pytest.raises(VersionNotFound):
            registry.version("JPCP", version)
    with pytest.raises(VersionNotFound):
        registry.set_alias("JPCP", "Canary", "99")
    assert registry.resolve("JPCP", "Canary").version == "2"


def test_set_alias_returns_the_previous_ref_and_delete_alias_removes_it(registry: MlflowRegistry) -> None:
    assert registry.set_alias("JPCP", "shadow", "1") is None
    previous = registry.set_alias("jpcp", "SHADOW", "2")
    assert previous is not None and (previous.name, previous.version) == ("JPCP", "1")
    assert registry.resolve("JPCP", "Shadow").version == "2"
    registry.delete_alias("JPCP", "Shadow")
    with pytest.raises(AliasNotFound):
        registry.resolve("JPCP", "shadow")
    with pytest.raises(AliasNotFound):
        registry.delete_alias("JPCP", "Shadow")


def test_an_alias_spelled_otherwise_in_mlflow_keeps_its_spelling(registry: MlflowRegistry) -> None:
    registry.client.set_registered_model_alias("AC", "shadow", "1")
    try:
        assert registry.resolve("AC", "Shadow").version == "1"
        previous = registry.set_alias("AC", "Shadow", "2")
        assert previous is not None and previous.version == "1"
        aliases = set(registry.client.get_registered_model("AC").aliases)
        assert aliases == {"Production", "Canary", "Staging", "shadow"}
        assert registry.resolve("AC", "SHADOW").version == "2"
    finally:
        registry.client.delete_registered_model_alias("AC", "shadow")


def test_list_versions_and_models(registry: MlflowRegistry) -> None:
    assert registry.list_models() == ["AC", "CRCP", "JPCP"]
    versions = registry.list_versions("AC")
    assert [(v.version, v.aliases) for v in versions] == [
        ("1", ("Production",)),
        ("2", ("Canary",)),
        ("3", ("Staging",)),
    ]
    assert all(v.created_at.tzinfo is not None and v.run_id for v in versions)


def test_fetch_and_load_predict_on_model_rows(registry: MlflowRegistry) -> None:
    x, nodes, _ = make_dataset(32, seed=123)
    rows = features(x, nodes)
    predictions = {}
    for alias in ("Production", "Canary"):
        location = registry.fetch(registry.resolve("JPCP", alias))
        assert (Path(location) / "MLmodel").is_file()
        model = load_sklearn_model(location)
        assert expected_features(model) == feature_count() == rows.shape[1]
        out = np.asarray(model.predict(rows))
        assert out.shape == (32,) and np.isfinite(out).all()
        assert np.asarray(model.predict(rows[:1])).shape == (1,)
        predictions[alias] = out
    assert not np.allclose(predictions["Production"], predictions["Canary"])


def test_fetch_downloads_a_remote_artifact_once_into_the_cache(
    registry: MlflowRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(mlflow_registry, "local_artifact_path", lambda uri: None)
    ref = registry.version("CRCP", "1")
    location = registry.fetch(ref)
    assert Path(location) == registry.cache_dir / "CRCP" / "1"
    assert (Path(location) / "MLmodel").is_file()
    assert registry.fetch(ref) == location
    assert sorted(p.name for p in (registry.cache_dir / "CRCP").iterdir()) == ["1"]
    assert expected_features(load_sklearn_model(location)) == 385


def test_unreachable_tracking_server_raises_registry_unavailable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    unreachable = MlflowRegistry(f"http://127.0.0.1:{free_port()}", tmp_path / "cache")  # nothing listens there
    with pytest.raises(RegistryUnavailable) as caught:
        unreachable.resolve("JPCP", "Production")
    assert caught.value.__cause__ is not None


def test_an_empty_store_knows_no_models(settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    empty = MlflowRegistry(settings.mlflow_tracking_uri, settings.state_dir / "cache")
    assert empty.list_models() == []
    with pytest.raises(ModelNotFound):
        empty.aliases("JPCP")
    assert not (tmp_path / "mlflow.db").exists()


def test_a_tracking_uri_mlflow_does_not_support_is_a_config_error(tmp_path: Path) -> None:
    registry = MlflowRegistry("foo://nowhere", tmp_path / "cache")
    with pytest.raises(ConfigError) as caught:
        registry.list_models()
    assert "foo://nowhere" in str(caught.value) and caught.value.__cause__ is not None
