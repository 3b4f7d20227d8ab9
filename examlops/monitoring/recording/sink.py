"""The ``RecordSink`` that writes records to Redis: drift snapshots, ``inference.served`` events, failure windows.

Contract of ``AuditRecordSink.write(records)``:

- Per record, one drift snapshot and one ``inference.served`` audit event, the whole batch in one audit
  append (one atomic script; ``AuditTrail.append_rows``). Each event carries the once key of its record's
  entry id (``stream.written_key``): a record written before, by this sink or by a recorder that died
  before settling it, is skipped by the script, so a batch re-written after a crash or a lost answer
  writes nothing twice.
- Then the batch's replies are classified and pushed to the shared failure windows in one script, under a
  call key derived from the batch's entry ids (a retry of the same batch counts nothing twice), and each
  window state is checked, which may queue a retrain request.
- ``StoreUnavailable`` when Redis is down: the caller retries the same batch. A record that cannot be
  turned into an event raises ``ValueError`` from ``row_of``; the sink leaves such records out (counted
  in ``skipped`` and logged).
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Sequence

from examlops.core.jsoncodec import canonical
from examlops.core.records import ServedInference
from examlops.monitoring.audit import INFERENCE_SERVED, AuditTrail, Row, format_ts
from examlops.monitoring.failures import FailureTracker, classify
from examlops.monitoring.recording.stream import written_key
from examlops.monitoring.snapshots import MODELS, PACKED, number, packed, stream_of

log = logging.getLogger(__name__)


class AuditRecordSink:
    """Writes records to the audit trail (with their snapshots) and the failure windows."""

    def __init__(self, trail: AuditTrail, tracker: FailureTracker | None = None) -> None:
        self.trail = trail
        self.tracker = tracker
        self.skipped = 0
        """Records that could not be turned into an event (logged, not written)."""

    def write(self, records: Sequence[ServedInference]) -> None:
        rows: list[Row] = []
        kept: list[ServedInference] = []
        for record in records:
            try:
                rows.append(row_of(record))
            except (ValueError, TypeError) as exc:
                self.skipped += 1
                log.error("record %s (job %s) cannot be recorded: %s", record.entry_id, record.job_id, exc)
            else:
                kept.append(record)
        if not rows:
            return
        self.trail.append_rows(rows, PACKED)
        if self.tracker is not None:
            self._observe(self.tracker, kept)

    def idle(self) -> None:
        self.trail.tick()

    def close(self) -> None:
        self.trail.checkpoint_now()

    @staticmethod
    def _observe(tracker: FailureTracker, records: Sequence[ServedInference]) -> None:
        """One push for the batch under its call key, then a check per due state, in order."""
        ids = ",".join(record.entry_id for record in records)
        key = f"examlops:recorded:failures:{hashlib.sha256(ids.encode()).hexdigest()[:32]}"
        outcomes = [(record.model, classify(record.status, record.reply)) for record in records]
        states = tracker.push_many(outcomes, call_key=key)
        for (model, _), state in zip(outcomes, states, strict=True):
            if state is not None and tracker.due(state):
                tracker.check(model, state)


def row_of(record: ServedInference) -> Row:
    """The audit event of one record, with its snapshot as the side write; ``ValueError`` for an unwritable one.

    Builds what ``Entry(..., side=snapshot_of(...).side_write()).row()`` gives without the intermediate
    objects: this runs once per bus job.
    """
    if not record.entry_id:
        raise ValueError("a record needs its entry id (its idempotency key)")
    reply = record.reply
    code = "" if reply.get("error") is None else str(reply.get("code") or "error")
    alias = str(reply.get("alias") or "")
    version = str(reply.get("version") or "")
    run_id = str(reply.get("run_id") or "")
    prediction = number(reply.get("prediction"))
    model, job_id, user_id, ts, status = record.model, record.job_id, record.caller, record.served_at, record.status
    row = (
        model, alias, version, run_id, prediction, record.norm, record.mean, record.std, record.node_count, job_id,
        user_id, float(ts), status, code,
    )  # fmt: skip
    data = {
        "job_id": job_id,
        "user_id": user_id,
        "alias": alias,
        "version": version,
        "run_id": run_id,
        "prediction": prediction,
        "status": status,
        "code": code,
        "trace": str(reply.get("trace") or ""),
    }
    return (written_key(record.entry_id), stream_of(model), (packed(row),), MODELS, model.lower(), format_ts(ts),
            INFERENCE_SERVED, model, canonical(data))  # fmt: skip
