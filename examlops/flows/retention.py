"""The retention flow: keeps Redis memory bounded by moving out what no longer has to live there.

Scheduled from ``prefect.yaml`` (deployment ``retention/retention``). Three tasks:

- ``audit-archive``: ``monitoring.audit.archive.Archiver.run``, the events a
  signed checkpoint covers moved to ``<state>/audit/archive/`` and trimmed from
  the stream (what `exa audit archive` does);
- ``audit-verify``: the whole chain, and every alias it moved against MLflow,
  verified after the archive run (the catalog aliases no event covers as
  notes) and the result stored for the dashboard
  (``bootstrap.moves.verify_and_record``, what `exa audit verify` runs), so its
  Control page shows a check at most one schedule old without walking the chain;
- ``snapshot-trim``: every model's drift snapshots older than
  ``recording.snapshot_max_age_s`` (or the run's ``snapshot_max_age_s``)
  trimmed, whether the drift flow read them or not.

Publishes a table artifact (``retention``). A task that fails (Redis or SQL
down, an archive refused: the message says why) fails the run after the other
task ran.
"""

from __future__ import annotations

import time
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_table_artifact
from prefect.cache_policies import NO_CACHE

from examlops.bootstrap.control import ControlPlane, audit_access
from examlops.core.settings import Settings


@task(name="audit-archive", cache_policy=NO_CACHE)
def archive_audit(settings: Settings) -> dict[str, Any]:
    """One archive run; its report as JSON."""
    with audit_access(settings) as audit:
        return audit.archiver.run().to_json()


@task(name="audit-verify", cache_policy=NO_CACHE)
def verify_audit(settings: Settings) -> dict[str, Any]:
    """One full verify of the trail and the aliases it moved, stored as the last verify result; that result as
    JSON (skipped while another run's verify holds the lease)."""
    from dataclasses import asdict

    from examlops.bootstrap.moves import verify_and_record
    from examlops.monitoring.audit.verified import one_verify

    with audit_access(settings) as audit, one_verify(audit.store.redis) as mine:
        if not mine:  # another verify is under way: one walk of the chain at a time
            return {"ok": None, "skipped": "another audit verify is running", "problems": []}
        return asdict(verify_and_record(settings, audit, "retention flow").record)


@task(name="snapshot-trim", cache_policy=NO_CACHE)
def trim_snapshots(plane: ControlPlane, max_age_s: float, now: float) -> dict[str, int]:
    """Per model with a snapshot stream, how many snapshots older than ``max_age_s`` were trimmed."""
    stream = plane.snapshot_stream
    return {model: stream.trim_older_than(model, max_age_s, now) for model in stream.models()}


@flow(name="retention")
def retention_flow(snapshot_max_age_s: float | None = None) -> dict[str, Any]:
    """Archive the checkpointed audit trail and trim expired snapshots; what each did."""
    plane = ControlPlane(Settings())
    max_age_s = snapshot_max_age_s or plane.settings.recording.snapshot_max_age_s
    logger = get_run_logger()
    try:
        archived = archive_audit(plane.settings, return_state=True)
        verified = verify_audit(plane.settings, return_state=True)
        trimmed = trim_snapshots(plane, max_age_s, time.time(), return_state=True)
    finally:
        if "snapshot_stream" in plane.__dict__:  # built by the task: close its client
            plane.snapshot_stream.redis.close()
    result: dict[str, Any] = {"audit": None, "verify": None, "snapshots": None, "snapshot_max_age_s": max_age_s}
    failed = []
    for name, state in (("audit", archived), ("verify", verified), ("snapshots", trimmed)):
        if state.is_completed():
            result[name] = state.result()
        else:
            failed.append(f"{name}: {state.message or state.name}")
    if result["audit"] is not None:
        logger.info(
            "audit: %d events archived, %d trimmed from Redis; the archive ends at event %d",
            result["audit"]["archived"], result["audit"]["trimmed"], result["audit"]["archive_last_seq"],
        )  # fmt: skip
    if result["verify"] is not None and result["verify"]["ok"] is False:
        logger.warning("audit trail verify failed: %s", "; ".join(result["verify"]["problems"]))
    for note in (result["verify"] or {}).get("notes", ()):
        logger.warning("audit trail verify: %s", note)
    if result["snapshots"] is not None:
        logger.info("snapshots older than %.0f s trimmed: %s", max_age_s, result["snapshots"] or "no streams")
    rows = [{"what": "audit events archived", "count": (result["audit"] or {}).get("archived")}]
    rows.append({"what": "audit entries trimmed", "count": (result["audit"] or {}).get("trimmed")})
    rows += [{"what": f"snapshots trimmed: {m}", "count": n} for m, n in (result["snapshots"] or {}).items()]
    create_table_artifact(key="retention", table=rows, description="What the retention run moved out of Redis")
    if failed:
        raise RuntimeError(f"retention failed for {'; '.join(failed)}")
    return result
