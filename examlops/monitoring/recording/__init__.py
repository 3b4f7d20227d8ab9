"""Recording: the records stream drained into drift snapshots, audit events and failure windows.

- ``stream``: the ``RecordStream`` port and ``RedisRecordStream`` (the records stream, group ``recorders``).
- ``sink``: ``AuditRecordSink``, the ``core.records.RecordSink`` that writes to the audit trail and windows.
- ``recorder``: ``Recorder``, the loop that reads batches, reclaims a dead recorder's, writes and settles.
"""

from examlops.monitoring.recording.recorder import Recorder, RecorderStats
from examlops.monitoring.recording.sink import AuditRecordSink, row_of
from examlops.monitoring.recording.stream import RecordStream, RedisRecordStream, written_key

__all__ = [
    "AuditRecordSink",
    "RecordStream",
    "Recorder",
    "RecorderStats",
    "RedisRecordStream",
    "row_of",
    "written_key",
]
