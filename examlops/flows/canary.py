"""The canary-analysis flow: ``loop.analysis.CanaryAnalysis`` for one model, with its artifacts.

Started as a subflow of a retrain run that put a better candidate on Canary, by `exa canary start MODEL`
(a run of the ``canary-analysis`` deployment), or from the Prefect UI. ``owner`` is the hold the run takes
over (the retrain run's); a standalone run holds the model as its own flow run. Publishes a table artifact
of the gates and a markdown artifact plotting the two versions side by side; the run fails when the
analysis raised (its record says why). A run cancelled or crashed mid-window puts its split back from its
cancellation and crash hooks (``loop.recovery.end_run``).
"""

from __future__ import annotations

from typing import Any

from prefect import flow, get_run_logger
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.runtime import flow_run

from examlops.bootstrap.loop import closed_loop
from examlops.core.errors import ConfigError
from examlops.core.settings import Settings
from examlops.flows.wiring import artifact_key
from examlops.loop.analysis import CanaryAnalysis
from examlops.loop.ports import LoopParts
from examlops.loop.report import gate_rows, side_by_side
from examlops.loop.window import AnalysisResult


def run_canary(
    settings: Settings, parts: LoopParts, model: str, *, owner: str, run: str, share: int | None = None
) -> AnalysisResult:
    """The analysis as the flow and `exa canary start --here` run it. ``ConfigError`` when tracing is off:
    the traces are the analysis's only figures, and without them it could never decide."""
    if not settings.tracing.enabled:
        raise ConfigError("the canary analysis reads the traces of every call, and tracing is off "
                          "(EXAMLOPS_TRACING__ENABLED=false): turn it on to run the closed loop")  # fmt: skip
    return CanaryAnalysis(parts).run(model, owner=owner, run=run, share=share)


def publish(result: AnalysisResult) -> None:
    """The decision as Prefect artifacts: a table of the gates and the side-by-side plot."""
    key = artifact_key("canary", result.model)
    create_table_artifact(key=key, table=gate_rows(result),
                          description=f"{result.model}: {result.decision}; {result.note}")  # fmt: skip
    create_markdown_artifact(key=f"{key}-plot", markdown=side_by_side(result),
                             description=f"{result.model}: Production and Canary side by side")  # fmt: skip


def _end_after(flow: Any, flow_run: Any, state: Any) -> None:
    """The run was cancelled or crashed mid-window: put its split back and end its hold now, rather than
    when the next loop finds its lease run out."""
    from examlops.loop.recovery import end_run

    settings = Settings()
    with closed_loop(settings, actor="system:canary") as parts:
        model = _spec(settings, str(flow_run.parameters.get("model", "")))
        record = parts.store.get(model)
        owners = {str(flow_run.parameters.get("owner") or ""), str(flow_run.id)}
        if record is not None and record.owner in owners:
            end_run(parts, record, f"its Prefect run {flow_run.name} ended {state.type.value.lower()}")


@flow(name="canary-analysis", on_cancellation=[_end_after], on_crashed=[_end_after])
def canary_flow(model: str, share: int | None = None, owner: str | None = None) -> dict[str, Any]:
    """Send ``share`` % (default: the setting) of ``model``'s default-alias traffic to Canary, compare it with
    Production over a window, then promote it, set its share to 0, or leave things as they were."""
    settings = Settings()
    logger = get_run_logger()
    run_id = str(flow_run.get_id() or "")
    with closed_loop(settings, actor="system:canary", say=logger.info) as parts:
        spec = _spec(settings, model)
        result = run_canary(settings, parts, spec, owner=owner or run_id, run=f"flow run {run_id}", share=share)
    publish(result)
    return result.to_json()


def _spec(settings: Settings, model: str) -> str:
    from examlops.bootstrap.serving import catalog

    return catalog(settings).get(model).name
