"""The retrain flow: one turn of the closed loop (``loop.cycle.retrain_cycle``) around
``registry.retrain.retrain``, with a table artifact and a ``model.retrained`` event.

Started by the bridges' failure trigger (its outbox creates a run of the ``retrain/retrain`` deployment with
``model``, ``reason``, ``source`` ``failure-trigger`` and ``requested_at``), by ``exa retrain MODEL
--via-prefect`` or from the Prefect UI (``source`` ``operator``). For the trigger, a model another loop holds drops the
request, and a model the loop promoted within the grace period is rolled back instead. A better candidate
goes to Canary and, with ``loop.auto_canary``, the canary-analysis flow runs as this run's subflow.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from prefect import flow, get_run_logger
from prefect.artifacts import create_table_artifact
from prefect.runtime import flow_run

from examlops.bootstrap.control import ControlPlane, audit_moves
from examlops.bootstrap.inference import holdout_scorer
from examlops.core.settings import Settings
from examlops.flows.wiring import MODEL_RETRAINED, artifact_key
from examlops.registry.retrain import RetrainResult, SyntheticDataSource, checked_candidate_alias, retrain


def prepare_retrain(
    plane: ControlPlane,
    model: str,
    *,
    reason: str = "",
    candidate_alias: str = "Canary",
    data_shift: float = 0.0,
    seed: int | None = None,
    on_progress: Callable[[str], None] | None = None,
    actor: str = "system:retrain",
) -> Callable[[], RetrainResult]:
    """The retrain of ``model`` with the synthetic data source, audited (``model.retrained``), as the flow and
    `exa retrain` hand it to ``loop.cycle.retrain_cycle``; the request is checked now, before it is returned.

    ``ModelNotFound`` for a model not in the catalog, ``InvalidInput`` for an alias that is not a candidate
    alias or a negative ``data_shift``: raised here, before the cycle holds the model, because the cycle
    records whatever the retrain raises as the model's loop outcome, and refused input is no outcome.
    """
    spec = plane.catalog.get(model)
    alias = checked_candidate_alias(candidate_alias)
    source = SyntheticDataSource(data_shift)

    def run() -> RetrainResult:
        audit = plane.audit
        result = retrain(
            plane.settings,
            plane.registry,
            spec,
            source,
            score=holdout_scorer(plane.settings),
            candidate_alias=alias,
            seed=seed,
            reason=reason,
            on_progress=on_progress,
            trail=audit_moves(audit, plane.redis, actor, by="retrain"),
        )
        data = {**asdict(result), "better": result.better, "reason": reason, "actor": actor}
        audit(MODEL_RETRAINED, result.model, data)
        return result

    return run


@flow(name="retrain")
def retrain_flow(
    model: str,
    reason: str = "",
    candidate_alias: str = "Canary",
    data_shift: float = 0.0,
    seed: int | None = None,
    actor: str = "system:retrain",
    source: str = "operator",
    requested_at: float | None = None,
) -> dict[str, Any]:
    """Train a candidate of ``model`` on fresh data and compare it with Production; a better one goes to
    Canary and its canary analysis runs. ``actor`` is the identity that triggered the run (``system:retrain``
    for the failure trigger); ``source`` is ``failure-trigger`` (the trigger's outbox passes it, with
    ``requested_at``) or ``operator`` (the UI, `exa retrain --via-prefect`)."""
    from examlops.bootstrap.loop import closed_loop
    from examlops.flows.canary import canary_flow
    from examlops.loop.cycle import retrain_cycle

    settings = Settings()
    plane = ControlPlane(settings)
    logger = get_run_logger()
    name = plane.catalog.get(model).name
    owner = str(flow_run.get_id() or f"retrain-{name}")
    results: list[RetrainResult] = []

    train = prepare_retrain(plane, name, reason=reason, candidate_alias=candidate_alias, data_shift=data_shift,
                            seed=seed, on_progress=logger.info, actor=actor)  # fmt: skip

    def retrain() -> RetrainResult:
        result = train()
        results.append(result)
        summary = {**asdict(result), "better": result.better}
        create_table_artifact(
            key=artifact_key("retrain", result.model),
            table=[{"field": key, "value": value} for key, value in summary.items()],
            description=f"Retrained {result.model}: version {result.version}"
            + (f" is {result.alias}" if result.moved else f" kept back ({result.alias} not moved)"),
        )
        return result

    def analyse() -> dict[str, Any]:
        return canary_flow(name, owner=owner)

    with closed_loop(settings, actor=actor, say=logger.info) as parts:
        cycle = retrain_cycle(
            parts, name, owner=owner, run=f"flow run {owner}", from_trigger=source == "failure-trigger",
            retrain=retrain, analyse=analyse if settings.loop.auto_canary else None, reason=reason,
            requested_at=requested_at,
        )  # fmt: skip
    retrained = results[0] if results else None
    if cycle.action in ("dropped", "rolled_back", "kept_back"):  # the analysis publishes its own decision
        rows = [{"field": "action", "value": cycle.action}, {"field": "note", "value": cycle.note}]
        if cycle.rollback is not None:
            rows += [{"field": key, "value": value} for key, value in asdict(cycle.rollback).items()]
        create_table_artifact(key=artifact_key("loop", name), table=rows, description=f"{name}: {cycle.note}")
    return {
        "model": name,
        "action": cycle.action,
        "note": cycle.note,
        "retrain": None if retrained is None else {**asdict(retrained), "better": retrained.better},
        "analysis": cycle.analysis,
        "rollback": None if cycle.rollback is None else asdict(cycle.rollback),
    }
