"""Operator actions from the dashboard: set a split, reload, promote Canary, roll back Production.

Each goes through the service its CLI twin uses, and so leaves the same audit event naming the identity
that asked: ``Pipeline.set_traffic`` (``traffic.changed``; what `PUT /v1/traffic` and `exa serve traffic`
do), ``Pipeline.reload`` (``model.reloaded``...; `exa serve reload`), the ``Promoter`` port over
``examlops.promotion.service`` (``alias.moved``; `exa promote --from Canary` and `exa rollback`).

``describe`` is what the confirmation page asks; ``fingerprint`` what its one-time token is bound to
(``sessions.issue_once``); ``check`` refuses, before the page asks, a split the pipeline would refuse
(``Pipeline.check_traffic``: weights that are negative, not whole or do not sum to 100, an alias the model does
not have); ``perform`` does it and answers an ``Outcome`` (what happened, and what the service warned of without
stopping: a promotion the trail could not account for). Both refuse first: ``Forbidden`` without the action's
permission, ``InvalidInput`` for an unknown action or model or a malformed weight, ``NotFound``-family errors
from the services as they are; ``perform`` raises what the service raises (``StoreUnavailable`` for a split
whose audit event cannot be written: the split is not changed). The caller checks the session's CSRF token
before ``perform``.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from examlops.core.errors import InvalidInput, ModelNotFound
from examlops.dashboard.ports import DashboardSources, Pipeline
from examlops.dashboard.views import ACTIONS, visible_models
from examlops.identity import Caller

SPLIT_ALIASES = ("Production", "Canary", "Staging")


@dataclass(frozen=True, slots=True)
class ActionRequest:
    action: str
    model: str
    weights: dict[str, int]


@dataclass(frozen=True, slots=True)
class Outcome:
    message: str
    warnings: tuple[str, ...] = ()


def fingerprint(request: ActionRequest) -> str:
    """The action as one string: a one-time token confirms this action and no other."""
    weights = ",".join(f"{alias}={weight}" for alias, weight in sorted(request.weights.items()))
    return f"{request.action}|{request.model}|{weights}"


def parse(form: dict[str, str], pipeline: Pipeline) -> ActionRequest:
    """The action a form asks for; ``InvalidInput`` when it names no known action, model or whole weights."""
    action = form.get("action", "")
    if action not in ACTIONS:
        raise InvalidInput(f"unknown action {action[:32]!r}: one of {', '.join(ACTIONS)}", field="action")
    try:
        model = pipeline.catalog.get(form.get("model", "")).name
    except ModelNotFound as exc:
        raise InvalidInput(str(exc), field="model") from exc
    weights: dict[str, int] = {}
    if action == "split":
        for alias in SPLIT_ALIASES:
            text = form.get(alias.lower(), "").strip()
            if not text:
                continue
            try:
                weights[alias] = int(text)
            except ValueError:
                raise InvalidInput(f"the weight of {alias} must be a whole number", field="weights") from None
        weights = {alias: weight for alias, weight in weights.items() if weight}
    return ActionRequest(action, model, weights)


def authorize(caller: Caller, request: ActionRequest, pipeline: Pipeline) -> None:
    """``Forbidden`` unless ``caller`` holds the action's permission and may see the model."""
    caller.require(ACTIONS[request.action])
    if request.model not in visible_models(caller, pipeline):
        raise InvalidInput(f"no model {request.model!r} here", field="model")


def check(request: ActionRequest, pipeline: Pipeline) -> None:
    """``InvalidInput`` for a split ``perform`` would be refused (after ``authorize``: it names the model's
    aliases); other actions are checked by their service when performed."""
    if request.action == "split":
        pipeline.check_traffic(request.model, request.weights)


def describe(request: ActionRequest) -> str:
    if request.action == "split":
        shown = " / ".join(f"{alias} {weight} %" for alias, weight in request.weights.items())
        return f"Set the traffic split of {request.model} to {shown or 'none (all to the default alias)'}"
    if request.action == "reload":
        return f"Reload {request.model}: follow every alias that moved in MLflow (load, swap, release)"
    if request.action == "promote":
        return f"Promote {request.model}: point Production at Canary's version; every serving instance reloads"
    return f"Roll back {request.model}: point Production at the version its last promotion replaced"


async def perform(caller: Caller, request: ActionRequest, pipeline: Pipeline, sources: DashboardSources) -> Outcome:
    """Do the action as ``caller``; what happened, for a person. Raises what the service raises."""
    authorize(caller, request, pipeline)
    if request.action == "split":
        split = await asyncio.to_thread(pipeline.set_traffic, request.model, request.weights, caller.name)
        shown = ", ".join(f"{alias} {weight} %" for alias, weight in split.items()) or "no split"
        return Outcome(f"{request.model}: traffic split is now {shown}")
    if request.action == "reload":
        changes = await pipeline.reload(request.model, actor=caller.name)
        if not changes:
            return Outcome(f"{request.model}: every alias in memory already matches MLflow")
        return Outcome(
            "; ".join(
                f"{c.model}@{c.alias}: {c.old_version or '-'} -> {c.new_version or '-'} {c.outcome}" for c in changes
            )
        )
    if sources.promoter is None:
        raise InvalidInput("promotion is not available in this process", field="action")
    if request.action == "promote":
        moved = await asyncio.to_thread(sources.promoter.promote_canary, request.model, caller.name)
    else:
        moved = await asyncio.to_thread(sources.promoter.rollback, request.model, caller.name)
    if moved.nothing_to_do:
        return Outcome(
            f"{moved.model}@Production: already at version {moved.new_version}, nothing moved; confirmed by "
            f"{len(moved.instances)} serving instance(s)",
            moved.warnings,
        )
    return Outcome(
        f"{moved.model}@Production: version {moved.old_version or '(unset)'} -> {moved.new_version}, "
        f"confirmed by {len(moved.instances)} serving instance(s)",
        moved.warnings,
    )
