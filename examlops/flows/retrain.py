"""The retrain flow: ``registry.retrain.retrain`` for one model, a table artifact and a ``model.retrained`` event.

Started by the bridges' failure tracker (its outbox creates a run of the
``retrain/retrain`` deployment with ``model`` and ``reason``), by
``exa retrain MODEL --via-prefect``, or from the Prefect UI.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from prefect import flow, get_run_logger
from prefect.artifacts import create_table_artifact

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
) -> dict[str, Any]:
    """Train a candidate of ``model`` on fresh data, compare it with Production, register it, point Canary at it.
    ``actor`` is the identity that triggered the run (``system:retrain`` for the failure trigger)."""
    plane = ControlPlane(Settings())
    logger = get_run_logger()
    result = run_retrain(
        plane, model, reason=reason, candidate_alias=candidate_alias, data_shift=data_shift, seed=seed,
        audit=plane.audit, on_progress=logger.info, actor=actor,
    )  # fmt: skip
    summary = {**asdict(result), "better": result.better}
    create_table_artifact(
        key=artifact_key("retrain", result.model),
        table=[{"field": key, "value": value} for key, value in summary.items()],
        description=f"Retrained {result.model}: version {result.version} is {result.alias}",
    )
    return summary
