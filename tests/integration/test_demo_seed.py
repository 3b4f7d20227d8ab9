"""seed_demo against a real temporary SQLite MLflow store, seeded once for the module."""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import yaml

from examlops.core.settings import Settings
from examlops.registry.catalog import Catalog, load_catalog
from examlops.registry.demo import DEMO_EXPERIMENT, FAULTY_DESCRIPTION, SeedReport, seed_demo
from examlops.registry.demo_models import FAULTY_SKOPS_TYPES
from examlops.registry.loader import load_sklearn_model
from examlops.registry.mlflow_registry import MlflowRegistry
from examlops.registry.registration import TRUSTED_SKOPS_TYPES
from examlops.registry.synthetic import features, make_dataset

pytestmark = pytest.mark.integration


@dataclass(frozen=True)
class Seeded:
    root: Path
    settings: Settings
    catalog: Catalog
    report: SeedReport
    progress: tuple[str, ...]
    registry: MlflowRegistry


@pytest.fixture(scope="module")
def seeded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Seeded]:
    """One seeded store for the module, run from an empty working directory that must stay empty."""
    root = tmp_path_factory.mktemp("seed")
    (root / "state").mkdir()
    (root / "cwd").mkdir()
    with pytest.MonkeyPatch.context() as mp:
        for name in list(os.environ):
            if name.startswith("EXAMLOPS_"):
                mp.delenv(name)
        mp.chdir(root / "cwd")
        settings = Settings(home=root / "state")
        catalog = load_catalog(settings.catalog_path)
        progress: list[str] = []
        report = seed_demo(settings, catalog, progress.append)
        registry = MlflowRegistry(settings.mlflow_tracking_uri, settings.state_dir / "cache")
        yield Seeded(root, settings, catalog, report, tuple(progress), registry)


def test_seed_registers_three_versions_per_model_with_production_1_canary_2_and_staging_3(seeded: Seeded) -> None:
    assert sorted(seeded.report.created) == ["AC", "CRCP", "JPCP"] and seeded.report.skipped == ()
    assert seeded.registry.list_models() == ["AC", "CRCP", "JPCP"]
    for name in seeded.catalog.names:
        versions = seeded.registry.list_versions(name)
        assert [(v.version, v.aliases) for v in versions] == [
            ("1", ("Production",)),
            ("2", ("Canary",)),
            ("3", ("Staging",)),
        ]
        assert len({v.run_id for v in versions}) == 3


def test_the_staging_version_says_it_fails_on_purpose(seeded: Seeded) -> None:
    client = seeded.registry.client
    for name in seeded.catalog.names:
        staging = seeded.registry.resolve(name, "Staging")
        version = client.get_model_version(name, staging.version)
        assert version.description == FAULTY_DESCRIPTION
        assert "fails on purpose" in version.description
        assert version.tags["examlops.demo"] == "fails-on-purpose"
        assert client.get_run(staging.run_id).data.tags["mlflow.note.content"] == FAULTY_DESCRIPTION
        assert not client.get_model_version(name, seeded.registry.resolve(name, "Production").version).description


def test_the_staging_version_loads_with_only_default_skops_types_and_fails_on_normal_rows(seeded: Seeded) -> None:
    ref = seeded.registry.resolve("JPCP", "Staging")
    location = seeded.registry.fetch(ref)
    mlmodel = yaml.safe_load((Path(location) / "MLmodel").read_text())
    assert mlmodel["flavors"]["sklearn"]["serialization_format"] == "skops"
    assert mlmodel["flavors"]["sklearn"]["skops_trusted_types"] == list(FAULTY_SKOPS_TYPES) == []
    model = load_sklearn_model(location)
    x, nodes, _ = make_dataset(8, seed=77)
    rows = features(x, nodes)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # numpy's "invalid value encountered in log"
        with pytest.raises(ValueError, match="Input X contains NaN"):
            model.predict(rows)
        with pytest.raises(ValueError, match="Input X contains NaN"):
            model.predict(rows[:1])
    # The good versions answer the same rows.
    good = load_sklearn_model(seeded.registry.fetch(seeded.registry.resolve("JPCP", "Production")))
    assert np.isfinite(np.asarray(good.predict(rows))).all()


def test_each_version_is_logged_in_a_demo_run_with_a_385_column_tensor_signature(seeded: Seeded) -> None:
    client = seeded.registry.client
    experiment = client.get_experiment_by_name(DEMO_EXPERIMENT)
    artifact_root = seeded.settings.mlflow_artifact_root
    assert experiment.artifact_location.startswith(artifact_root.as_uri())
    ref = seeded.registry.resolve("JPCP", "Production")
    assert client.get_run(ref.run_id).info.experiment_id == experiment.experiment_id
    mlmodel = yaml.safe_load((Path(seeded.registry.fetch(ref)) / "MLmodel").read_text())
    assert '"shape": [-1, 385]' in mlmodel["signature"]["inputs"]
    assert '"tensor"' in mlmodel["signature"]["inputs"]
    assert mlmodel["flavors"]["sklearn"]["serialization_format"] == "skops"
    assert mlmodel["flavors"]["sklearn"]["skops_trusted_types"] == list(TRUSTED_SKOPS_TYPES)


def test_seed_reports_progress_for_every_model(seeded: Seeded) -> None:
    for name in seeded.catalog.names:
        assert any(message.startswith(f"{name}: Production -> version 1") for message in seeded.progress)
        assert any(message.startswith(f"{name}: Canary -> version 2") for message in seeded.progress)
        assert any(message.startswith(f"{name}: Staging -> version 3") for message in seeded.progress)


def test_second_seed_skips_every_model_and_changes_nothing(seeded: Seeded) -> None:
    before = {name: seeded.registry.list_versions(name) for name in seeded.catalog.names}
    report = seed_demo(seeded.settings, seeded.catalog)
    assert report.created == () and sorted(report.skipped) == ["AC", "CRCP", "JPCP"]
    assert {name: seeded.registry.list_versions(name) for name in seeded.catalog.names} == before


def test_seed_writes_nothing_outside_the_state_folder(seeded: Seeded) -> None:
    assert sorted(p.name for p in seeded.root.iterdir()) == ["cwd", "state"]
    assert list((seeded.root / "cwd").iterdir()) == []
    assert not Path("mlflow.db").exists() and not Path("mlruns").exists()
    assert (seeded.settings.mlflow_dir / "mlflow.db").is_file()
    assert any(seeded.settings.mlflow_artifact_root.rglob("MLmodel"))


def test_seed_sets_only_a_missing_alias_and_never_moves_one_a_user_set(
    settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    full = load_catalog(settings.catalog_path)
    catalog = Catalog(models=(full.get("AC"),))
    seed_demo(settings, catalog)
    registry = MlflowRegistry(settings.mlflow_tracking_uri, settings.state_dir / "cache")
    registry.set_alias("AC", "Production", "2")
    registry.delete_alias("AC", "Canary")

    report = seed_demo(settings, catalog)

    assert report.created == ("AC",)
    assert registry.resolve("AC", "Production").version == "2"
    assert registry.resolve("AC", "Canary").version == "5"
    assert registry.resolve("AC", "Staging").version == "3"
    assert [v.version for v in registry.list_versions("AC")] == ["1", "2", "3", "4", "5"]
    assert not (tmp_path / "mlflow.db").exists() and not (tmp_path / "mlruns").exists()


def test_seed_adds_only_the_failing_version_to_a_model_lacking_only_staging(
    settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    catalog = Catalog(models=(load_catalog(settings.catalog_path).get("AC"),))
    seed_demo(settings, catalog)
    registry = MlflowRegistry(settings.mlflow_tracking_uri, settings.state_dir / "cache")
    registry.delete_alias("AC", "Staging")

    progress: list[str] = []
    report = seed_demo(settings, catalog, progress.append)

    assert report.created == ("AC",)
    assert [(v.version, v.aliases) for v in registry.list_versions("AC")] == [
        ("1", ("Production",)),
        ("2", ("Canary",)),
        ("3", ()),
        ("4", ("Staging",)),
    ]
    assert registry.client.get_model_version("AC", "4").description == FAULTY_DESCRIPTION
    assert not any("training" in message for message in progress)


def test_seed_never_moves_a_staging_alias_a_user_set(
    settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    catalog = Catalog(models=(load_catalog(settings.catalog_path).get("AC"),))
    seed_demo(settings, catalog)
    registry = MlflowRegistry(settings.mlflow_tracking_uri, settings.state_dir / "cache")
    registry.set_alias("AC", "Staging", "2")

    report = seed_demo(settings, catalog)

    assert report == SeedReport(created=(), skipped=("AC",))
    assert registry.resolve("AC", "Staging").version == "2"
    assert [v.version for v in registry.list_versions("AC")] == ["1", "2", "3"]
