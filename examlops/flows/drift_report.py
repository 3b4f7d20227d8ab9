"""The drift-report flow: one task per model runs ``monitoring.drift_report.run_drift_report``; artifacts for the UI.

Scheduled from ``prefect.yaml`` (every 15 minutes). Publishes one table
artifact (``drift-report``: per model, prediction and input verdicts, scores,
window, report paths) and one markdown artifact per reported model
(``drift-<model>``) naming its HTML and JSON report. A model that cannot be
reported (registry or Redis down, no Production alias) fails its task and
the run, after the other models were reported.
"""

from __future__ import annotations

from typing import Any

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.cache_policies import NO_CACHE

from examlops.bootstrap.control import ControlPlane
from examlops.core.settings import Settings
from examlops.flows.wiring import artifact_key
from examlops.monitoring.drift_report import MIN_ROWS, DriftReport, run_drift_report


def report_row(model: str, report: DriftReport | None) -> dict[str, Any]:
    """One row of the run's table artifact (and of ``exa drift report``'s output)."""
    if report is None:
        return {"model": model, "reported": False, "prediction_drift": None, "input_drift": None}
    return {
        "model": model,
        "reported": True,
        "version": report.version,
        "prediction_drift": report.prediction.drifted,
        "prediction_score": round(report.prediction.score, 6),
        "input_drift": report.input.drifted,
        "input_score": round(report.input.score, 6),
        "method": f"{report.prediction.method} p<{report.prediction.threshold}",
        "rows": report.window.rows,
        "window": f"{report.window.start:%Y-%m-%d %H:%M:%S} .. {report.window.end:%H:%M:%S} UTC",
        "report": str(report.html_path),
    }


@task(name="drift-report-model", cache_policy=NO_CACHE, task_run_name="drift-{model}")
def report_model(plane: ControlPlane, model: str, min_rows: int) -> dict[str, Any]:
    report = run_drift_report(
        model,
        plane.snapshots,
        plane.references,
        plane.drift_store,
        plane.drift_dir,
        min_rows=min_rows,
    )
    logger = get_run_logger()
    if report is None:
        logger.info("%s: fewer than %d new snapshots of its Production version; nothing reported", model, min_rows)
    else:
        logger.info(
            "%s: prediction drift %s (p=%.4g), input drift %s (p=%.4g) over %d snapshots; %s",
            model, report.prediction.drifted, report.prediction.score, report.input.drifted,
            report.input.score, report.window.rows, report.html_path,
        )  # fmt: skip
        create_markdown_artifact(
            key=artifact_key("drift", model),
            markdown=f"# Drift of {model} (version {report.version})\n\n"
            f"- prediction drift: **{report.prediction.drifted}** (K-S p = {report.prediction.score:.4g})\n"
            f"- input drift: **{report.input.drifted}** (K-S p = {report.input.score:.4g})\n"
            f"- window: {report.window.rows} snapshots, {report.window.start} .. {report.window.end}\n"
            f"- reference: {report.reference}\n"
            f"- HTML report: `{report.html_path}`\n- JSON summary: `{report.json_path}`\n",
            description=f"Evidently drift report of {model}",
        )
    return report_row(model, report)


@flow(name="drift-report")
def drift_report_flow(models: list[str] | None = None, min_rows: int = MIN_ROWS) -> list[dict[str, Any]]:
    """Report the drift of every catalog model (or of ``models``) over its snapshots since the last report."""
    plane = ControlPlane(Settings())
    names = [plane.catalog.get(name).name for name in models] if models else list(plane.catalog.names)
    table: list[dict[str, Any]] = []
    failed: list[str] = []
    for name in names:  # one after the other: Evidently is CPU-bound, and a failed model must not stop the rest
        state = report_model(plane, name, min_rows, return_state=True)
        if state.is_completed():
            table.append(state.result())
        else:
            failed.append(name)
            table.append({"model": name, "reported": False, "error": state.message or state.name})
    create_table_artifact(key="drift-report", table=table, description="Drift per model (K-S, p < 0.05 drifts)")
    if failed:
        raise RuntimeError(f"the drift report failed for {', '.join(failed)} (see their task runs)")
    return table
