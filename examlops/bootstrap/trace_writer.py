"""Serving's trace writes in a child process: the SQL work leaves the serving process and its GIL.

``ChildTraceStore`` is the store a serving instance's ``TraceSink`` writes through: ``add`` and ``prune`` go
to a child process over a pipe and wait for its answer (the sink's writer thread waits, with the GIL
released); reads go to SQL directly. The child, started on first use at ``tracing.nice``, writes with
``SqlTraceStore``. Why: a row's SQL write is Python work that, in serving's own process, came off its
event loop (``bench/auth_trace_cost.py``; figures in ``bench/RESULTS.md``).

Failure modes: a child that died, or a pipe that broke, is ``StoreUnavailable`` (the sink retries the
batch with backoff, and the next call starts a new child); a store that is down in the child is
``StoreUnavailable`` too; anything else the child met is a ``RuntimeError`` naming it (the sink writes the
batch again in halves and drops what is refused: ``tracing.sink``). The child reads its settings from its
environment, as every child does, and refuses to write when they name another database than its parent's
(checked by digest: no secret crosses the pipe).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import operator
import os
import signal
import threading
from collections.abc import Sequence
from dataclasses import fields
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any

from examlops.core import children
from examlops.core.errors import StoreUnavailable
from examlops.core.settings import Settings
from examlops.tracing import Pruned, TraceQuery, TraceRecord, TraceStore

log = logging.getLogger(__name__)

FIELDS = tuple(f.name for f in fields(TraceRecord))
"""A record travels as the tuple of its fields in this order (cheaper to pickle than the object)."""
_fields_of = operator.attrgetter(*FIELDS)
STOP_S = 10.0
MISMATCH = "the trace writer's environment names another database than its serving process's"


def sql_digest(settings: Settings) -> str:
    """A digest of the database URL: what parent and child compare instead of sending the URL."""
    return hashlib.sha256(settings.sql_url.encode()).hexdigest()


class ChildTraceStore:
    """A ``TraceStore`` whose writes happen in a child process (contract above); ``reader`` serves reads."""

    def __init__(self, settings: Settings, reader: TraceStore) -> None:
        self._digest = sql_digest(settings)
        self._reader = reader
        self._lock = threading.Lock()
        self._process: BaseProcess | None = None
        self._conn: Connection | None = None

    def add(self, records: Sequence[TraceRecord]) -> int:
        rows = [_fields_of(record) for record in records]
        return int(self._call("add", rows))

    def prune(self, now: float, *, payload_max_age_s: float, row_max_age_s: float) -> Pruned:
        done: Pruned = self._call("prune", (now, payload_max_age_s, row_max_age_s))
        return done

    def get(self, trace_id: str) -> TraceRecord | None:
        return self._reader.get(trace_id)

    def find(self, query: TraceQuery) -> list[TraceRecord]:
        return self._reader.find(query)

    def count(self, query: TraceQuery) -> int:
        return self._reader.count(query)

    def close(self) -> None:
        """Tell the child to finish and wait for it (``STOP_S`` at most, then it is killed)."""
        with self._lock:
            if self._conn is not None:
                with contextlib.suppress(OSError):  # a child already gone: nothing to tell
                    self._conn.send(None)
            self._reset(ask=False)

    def _call(self, op: str, arg: Any) -> Any:
        with self._lock:
            try:
                conn = self._connected()
                conn.send((op, arg))
                kind, value = conn.recv()
            except (EOFError, OSError) as exc:
                self._reset(ask=True)
                raise StoreUnavailable(f"the trace writer process is gone ({type(exc).__name__})") from exc
        if kind == "ok":
            return value
        if kind == "unavailable":
            raise StoreUnavailable(str(value))
        raise RuntimeError(f"the trace writer process failed: {value}")

    def _connected(self) -> Connection:
        if self._conn is None or self._process is None or not self._process.is_alive():
            self._reset(ask=True)
            parent, child = children.CONTEXT.Pipe()
            self._process = children.start_child(
                writer_main, (child, os.getpid(), self._digest), name="examlops-trace-writer"
            )
            child.close()
            self._conn = parent
        return self._conn

    def _reset(self, *, ask: bool) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        if self._process is not None:
            code = children.stop_child(self._process, STOP_S, ask=ask)
            if code not in (0, None):
                log.warning("the trace writer process ended with code %s", code)
            self._process = None


def writer_main(conn: Connection, parent_pid: int, digest: str) -> None:
    """The child's entry: answer ``(op, arg)`` messages with ``(kind, value)`` until ``None`` or EOF.

    It ignores SIGINT and SIGTERM (they reach serving's whole process group; serving closes the pipe when it
    has flushed its traces) and exits with its parent.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    children.exit_with_parent(parent_pid)
    from examlops.bootstrap.sql import sql_engine
    from examlops.tracing.sql_store import SqlTraceStore

    settings = Settings()
    mismatch = sql_digest(settings) != digest
    engine = None if mismatch else sql_engine(settings)
    store = None if engine is None else SqlTraceStore(engine)  # one store: it keeps its compiled statements
    children.lower_priority(settings.tracing.nice)
    while True:
        try:
            message = conn.recv()
        except EOFError:
            break
        if message is None:
            break
        if store is None:
            conn.send(("error", MISMATCH))
            continue
        op, arg = message
        try:
            if op == "add":
                value: Any = store.add([TraceRecord(*row) for row in arg])
            else:
                now, payload_max_age_s, row_max_age_s = arg
                value = store.prune(now, payload_max_age_s=payload_max_age_s, row_max_age_s=row_max_age_s)
            conn.send(("ok", value))
        except StoreUnavailable as exc:
            conn.send(("unavailable", str(exc)))
        except Exception as exc:
            log.exception("the trace writer could not %s", op)
            conn.send(("error", f"{type(exc).__name__}: {str(exc)[:300]}"))
    if engine is not None:
        engine.dispose()
