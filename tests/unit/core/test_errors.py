from __future__ import annotations

import pytest

from examlops.core import errors


@pytest.mark.parametrize(
    ("error", "model_failure"),
    [
        (errors.InvalidInput("x"), False),
        (errors.ModelNotFound("x"), False),
        (errors.PipelineUnavailable("x"), False),
        (errors.InferenceFailed("x"), True),
        (errors.InferenceTimeout("x"), True),
    ],
)
def test_only_model_failures_count_toward_the_retrain_trigger(error: errors.ExamlopsError, model_failure: bool) -> None:
    assert error.model_failure is model_failure


def test_builtin_mixins_let_callers_catch_by_meaning() -> None:
    assert isinstance(errors.InvalidInput("x"), ValueError)
    assert isinstance(errors.ModelNotFound("x"), LookupError)
    assert isinstance(errors.RegistryUnavailable("x"), ConnectionError)


def test_dependency_errors_are_retryable_and_validation_is_not() -> None:
    assert errors.WorkerLost("x").retryable
    assert errors.StoreUnavailable("x").retryable
    assert not errors.InvalidInput("x").retryable


def test_catalog_error_names_file_and_field() -> None:
    error = errors.CatalogError("is not a UUID", file="jpcp.yaml", field="seanerbus_uuid")
    assert str(error) == "jpcp.yaml: seanerbus_uuid: is not a UUID"
