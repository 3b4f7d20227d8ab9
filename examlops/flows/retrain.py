"""The retrain flow: one turn of the closed loop (``loop.cycle.retrain_cycle``) around
``registry.retrain.retrain``, with a table artifact and a ``model.retrained`` event.

Started by the bridges' failure trigger (its outbox creates a run of the ``retrain/retrain`` deployment with
``model``, ``reason``, ``source`` ``failure-trigger`` and ``requested_at``), by ``exa retrain MODEL
--via-prefect`` or from the Prefect UI (``source`` ``operator``). For the trigger, a model another loop holds drops the
request, and a model the loop promoted within the grace period is rolled back instead. A better candidate
goes to Canary and, with ``loop.auto_canary``, the canary-analysis flow runs as this run's subflow.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from prefect import flow, get_run_logger
from prefect.artifacts import create_table_artifact
from prefect.runtime import flow_run

from examlops.bootstrap.control import AuditHook, ControlPlane
from examlops.bootstrap.inference import holdout_scorer
from examlops.core.settings import Settings
from examlops.flows.wiring import MODEL_RETRAINED, artifact_key
from examlops.registry.retrain import RetrainResult, SyntheticDataSource, retrain


def run_retrain(
    plane: ControlPlane,
    model: str,
    *,
    reason: str = "",
    candidate_alias: str = "Canary",
    data_shift: float = 0.0,
    seed: int | None = None,
    audit: AuditHook | None = None,
    on_progress: Any = None,
    actor: str = "system:retrain",
) -> RetrainResult:
    """Retrain ``model`` with the synthetic data source and append the audit event (the flow and the CLI)."""
    spec = plane.catalog.get(model)
    result = retrain(
        plane.settings,
        plane.registry,
        spec,
        SyntheticDataSource(data_shift),
        score=holdout_scorer(plane.settings),
        candidate_alias=candidate_alias,
        seed=seed,
        reason=reason,
        on_progress=on_progress,
    )
    if audit is not None:
        data = {**asdict(result), "better": result.better, "reason": reason, "actor": actor}
        audit(MODEL_RETRAINED, result.model, data)
    return result


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

    def retrain() -> RetrainResult:
        result = run_retrain(
            plane, name, reason=reason, candidate_alias=candidate_alias, data_shift=data_shift, seed=seed,
            audit=plane.audit, on_progress=logger.info, actor=actor,
        )  # fmt: skip
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
