"""Translation of MLflow failures into our errors, without touching a store."""

from __future__ import annotations

from pathlib import Path

import pytest

from examlops.core.errors import (
    Conflict,
    ExamlopsError,
    InvalidInput,
    ModelNotFound,
    RegistryUnavailable,
)
from examlops.registry.mlflow_client import translate_error
from examlops.registry.mlflow_registry import MlflowRegistry, local_artifact_path


class _FakeMlflowError(Exception):
    def __init__(self, message: str, error_code: str) -> None:
        super().__init__(message)
        self.error_code = error_code


class OperationalError(Exception):
    """Same name as sqlalchemy's: the translation goes by name, without importing sqlalchemy."""


def _missing() -> ExamlopsError:
    return ModelNotFound("missing")


@pytest.mark.parametrize(
    ("exc", "expected"),
    [
        (_FakeMlflowError("no such model", "RESOURCE_DOES_NOT_EXIST"), ModelNotFound),
        (_FakeMlflowError("API request to http://x failed with exception boom", "INTERNAL_ERROR"), RegistryUnavailable),
        (_FakeMlflowError("db locked", "TEMPORARILY_UNAVAILABLE"), RegistryUnavailable),
        (OperationalError("unable to open database file"), RegistryUnavailable),
        (ConnectionRefusedError("refused"), RegistryUnavailable),
        (_FakeMlflowError("exists", "RESOURCE_ALREADY_EXISTS"), Conflict),
        (_FakeMlflowError("bad alias", "INVALID_PARAMETER_VALUE"), InvalidInput),
    ],
)
def test_mlflow_failures_become_our_errors(exc: Exception, expected: type[ExamlopsError]) -> None:
    assert type(translate_error(exc, _missing)) is expected


def test_unknown_failures_stay_in_our_family() -> None:
    error = translate_error(_FakeMlflowError("odd", "INTERNAL_ERROR"), _missing)
    assert isinstance(error, ExamlopsError) and "odd" in str(error)


def test_local_artifact_uris_map_to_paths_and_remote_ones_do_not(tmp_path: Path) -> None:
    assert local_artifact_path(tmp_path.as_uri()) == tmp_path
    assert local_artifact_path(str(tmp_path)) == tmp_path
    assert local_artifact_path("s3://bucket/model") is None
    assert local_artifact_path("mlflow-artifacts:/1/models/m-1/artifacts") is None


def test_constructing_the_registry_connects_to_nothing(tmp_path: Path) -> None:
    registry = MlflowRegistry(f"sqlite:///{tmp_path / 'absent' / 'mlflow.db'}", tmp_path / "cache")
    assert registry.tracking_uri.endswith("mlflow.db")
    assert not (tmp_path / "absent").exists() and not (tmp_path / "cache").exists()
