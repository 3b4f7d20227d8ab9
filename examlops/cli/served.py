"""One prediction from serving through the inference port's examlops adapter (`exa predict`, `exa serve
infer-check`).

``SERVED`` is the spec: serving's instance in, its whole answer out (the prediction and which task, model,
alias, version and run answered, with what was left of the budget), so the commands print what they
printed when they posted by hand. ``served_prediction`` builds the client through the composition root
(``bootstrap.inference.serving_inference``), makes one call and gives the answer as serving sent it (only
the fields the reply carried). Its failures are the port's ``InferenceError``; ``as_examlops_error``
turns one into the error serving's code names (``unknown_task``, ``forbidden``, ``refused``, ...), so the
exit codes are those of ``cli/output.py``; an unreachable serving is ``PipelineUnavailable`` (exit 3).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from pydantic import BaseModel

from examlops.core import errors
from examlops.inference import InferenceError, InferenceSpec, Kind
from examlops.inference.adapters.examlops import ExamlopsTarget


class ServedInstance(BaseModel):
    embedding: list[float]
    node_count: int
    job_id: str | None = None


class ServedAnswer(BaseModel):
    """Serving's reply to one call (``api.schemas.InferReply``)."""

    task: str | None = None
    model: str
    alias: str
    version: str
    run_id: str | None = None
    prediction: float
    error: None = None
    job_id: str | None = None
    budget_ms: float | None = None
    budget_remaining_ms: float | None = None


REACH_S = 5.0
"""Seconds the CLI gives a call with a budget to reach serving and its answer to come back, beyond the budget."""

SERVED = InferenceSpec(name="served", input=ServedInstance, output=ServedAnswer)
REPLY_FIELDS = tuple(name for name in ServedAnswer.model_fields if name != "prediction")


def served_target(
    *, task: str | None = None, model: str | None = None, alias: str | None = None, version: int | None = None
) -> ExamlopsTarget:
    return ExamlopsTarget(task=task, model=model, alias=alias, version=version, reply_fields=REPLY_FIELDS)


def served_prediction(
    target: ExamlopsTarget, instance: Mapping[str, Any], *, url: str | None, budget_ms: float | None = None
) -> dict[str, Any]:
    """Serving's answer to one instance (a ``ServedInstance``'s fields, validated by the port: a bad one is
    ``InvalidInput``), as serving sent it. ``budget_ms`` is serving's budget for the call, from when it reads
    the call; the CLI waits ``REACH_S`` longer for the answer, so that serving's refusal of a budget it cannot
    meet reaches the user rather than a timeout of the CLI's own."""
    from examlops.bootstrap.inference import serving_inference
    from examlops.cli.output import load_settings

    settings = load_settings()
    inference = serving_inference(settings, SERVED.name, target, url=url)
    options: dict[str, Any] = {}
    if budget_ms is not None:
        options = {"timeout": timedelta(milliseconds=budget_ms, seconds=REACH_S), "budget_ms": budget_ms}

    async def call() -> ServedAnswer:
        async with inference:
            return await inference.model(SERVED).predict(instance, options=options)

    try:
        answer = asyncio.run(call())
    except InferenceError as exc:
        raise as_examlops_error(exc, url or settings.serving.local_url) from exc
    return answer.model_dump(mode="json", exclude_unset=True)


def as_examlops_error(error: InferenceError, url: str) -> errors.ExamlopsError:
    """The error serving's code names, else the one the failure's kind means to the CLI."""
    message = error.message
    if error.code == "unauthenticated":
        from examlops.cli.output import token_hint

        return errors.Unauthenticated(f"{message} ({token_hint()})")
    if error.code == "forbidden":
        return errors.Forbidden(message, permission="")
    if error.code == "refused":
        return errors.Refused(message, retry_after_s=error.retry_after_s or 1.0)
    known = errors.error_class(error.code)
    if known is not None:
        return known(message)
    if error.kind is Kind.INFRASTRUCTURE and error.code == "inference_infrastructure":
        return errors.PipelineUnavailable(f"serving at {url} cannot be reached ({message})")
    by_kind: dict[Kind, type[errors.ExamlopsError]] = {
        Kind.VALIDATION: errors.InvalidInput,
        Kind.PRECONDITION: errors.ExamlopsError,
        Kind.THROTTLED: errors.NotReady,
        Kind.TIMEOUT: errors.InferenceTimeout,
        Kind.MODEL_FAILURE: errors.InferenceFailed,
        Kind.INFRASTRUCTURE: errors.InferenceFailed,
    }
    return by_kind[error.kind](message)
