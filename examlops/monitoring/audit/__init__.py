"""The hash-chained audit trail: one concern per module.

- ``chain``: the format: events, their hash, what an appender hands over (``Entry``, ``SideWrite``, ``Row``).
- ``store``: the chain in Redis: the append and archive-trim scripts and ``RedisAuditStore``.
- ``trail``: ``AuditTrail``, the appender (compare-and-set loop, checkpoint schedule).
- ``checkpoints``: signed checkpoints in SQL.
- ``segments``: the archive's JSONL segment files; ``archive``: ``Archiver``, retention out of Redis.
- ``walk`` and ``verify``: reading the chain back (archive, then stream): ``tail`` and ``verify``.

The names other packages use are re-exported here.
"""

from examlops.core.jsoncodec import canonical as canonical_json
from examlops.monitoring.audit.chain import (
    ALIAS_MOVE_FAILED,
    ALIAS_MOVE_INTENDED,
    ALIAS_MOVED,
    GENESIS,
    INFERENCE_SERVED,
    MODEL_RELOADED,
    RELOAD_REFUSED,
    RETRAIN_REQUESTED,
    TRAFFIC_CHANGE_FAILED,
    TRAFFIC_CHANGED,
    AuditEvent,
    Entry,
    Row,
    SideWrite,
    event_hash,
    format_ts,
)
from examlops.monitoring.audit.checkpoints import AuditCheckpoint, CheckpointStore, SqlCheckpointStore
from examlops.monitoring.audit.store import HEAD, STREAM
from examlops.monitoring.audit.trail import AuditTrail
from examlops.monitoring.audit.verify import VerifyReport, tail, verify
from examlops.monitoring.audit.walk import BrokenLink

__all__ = [
    "ALIAS_MOVED",
    "ALIAS_MOVE_FAILED",
    "ALIAS_MOVE_INTENDED",
    "GENESIS",
    "HEAD",
    "INFERENCE_SERVED",
    "MODEL_RELOADED",
    "RELOAD_REFUSED",
    "RETRAIN_REQUESTED",
    "STREAM",
    "TRAFFIC_CHANGED",
    "TRAFFIC_CHANGE_FAILED",
    "AuditCheckpoint",
    "AuditEvent",
    "AuditTrail",
    "BrokenLink",
    "CheckpointStore",
    "Entry",
    "Row",
    "SideWrite",
    "SqlCheckpointStore",
    "VerifyReport",
    "canonical_json",
    "event_hash",
    "format_ts",
    "tail",
    "verify",
]
