"""`exa predict` and `exa serve infer-check` get the port's failures as the errors serving's codes name,
so their exit codes stay those of ``cli/output.py``."""

from __future__ import annotations

import pytest

from examlops.cli.output import BAD_INPUT, NOT_FOUND, UNAVAILABLE, UNWELL, exit_code_of
from examlops.cli.served import as_examlops_error, served_target
from examlops.core import errors
from examlops.inference import InferenceError, Kind

URL = "http://serving"


@pytest.mark.parametrize(
    ("kind", "code", "expected", "exit_code"),
    [
        (Kind.PRECONDITION, "unknown_task", errors.TaskNotFound, NOT_FOUND),
        (Kind.PRECONDITION, "model_not_found", errors.ModelNotFound, NOT_FOUND),
        (Kind.VALIDATION, "invalid_input", errors.InvalidInput, BAD_INPUT),
        (Kind.VALIDATION, "inference_input_invalid", errors.InvalidInput, BAD_INPUT),
        (Kind.THROTTLED, "refused", errors.Refused, UNAVAILABLE),
        (Kind.INFRASTRUCTURE, "not_ready", errors.NotReady, UNAVAILABLE),
        (Kind.INFRASTRUCTURE, None, errors.PipelineUnavailable, UNAVAILABLE),
        (Kind.TIMEOUT, "inference_timeout", errors.InferenceTimeout, UNWELL),
        (Kind.MODEL_FAILURE, "inference_failed", errors.InferenceFailed, UNWELL),
        (Kind.PRECONDITION, "forbidden", errors.Forbidden, UNWELL),
    ],
)
def test_a_port_failure_is_the_error_its_code_names_with_the_clis_exit_code(
    kind: Kind, code: str | None, expected: type[errors.ExamlopsError], exit_code: int
) -> None:
    error = as_examlops_error(InferenceError(kind, "what serving said", code=code, backend="examlops"), URL)
    assert type(error) is expected
    assert exit_code_of(error) == exit_code


def test_an_unauthenticated_call_says_where_a_token_comes_from() -> None:
    error = as_examlops_error(InferenceError(Kind.PRECONDITION, "no", code="unauthenticated"), URL)
    assert isinstance(error, errors.Unauthenticated) and "EXAMLOPS_TOKEN" in str(error)


def test_the_target_asks_serving_for_its_whole_answer() -> None:
    target = served_target(model="JPCP", alias="Canary")
    assert {"model", "alias", "version", "run_id", "task", "budget_remaining_ms"} <= set(target.reply_fields)
    assert "prediction" not in target.reply_fields
