"""What ``closed_loop.py`` watches while the loop runs, each change stamped with the time it was first seen.

``Watch(settings, urls, headers, model)`` polls every ``poll_s`` in a thread of its own (``start``/``stop``):

- the audit trail's control events for the model (every type but ``inference.served``), with the time the
  trail itself recorded (``ts``): ``retrain.requested``, ``model.retrained``, ``loop.canary_started``,
  ``loop.decided``, ``alias.moved``, ``traffic.changed``, ``loop.trigger_dropped``, ``loop.rolled_back``;
- the model's loop record (``loop.sql.SqlLoopStore``): each phase it passes through;
- each serving instance's hot set (``GET /v1/models``): the version each alias serves, and the traffic
  split it applies (``GET /v1/traffic/{model}``).

``flow_runs(api)`` reads the Prefect API's ``retrain`` and ``canary-analysis`` runs (their start and end
times are Prefect's); ``last_retrain_request(settings, model)`` the retrain outbox's record of the model.
A poll that fails (a service restarting) is skipped: the next one sees the change, a little later.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import httpx
import redis

from examlops.bootstrap.sql import sql_engine
from examlops.core.settings import Settings
from examlops.loop.sql import SqlLoopStore
from examlops.monitoring.audit.store import STREAM
from examlops.monitoring.retrain import LAST

SERVED = "inference.served"


@dataclass(frozen=True, slots=True)
class Seen:
    at: float
    what: str
    """``audit``, ``phase``, ``serving`` (an instance's alias -> version) or ``split``."""
    key: str
    """The event type, the phase, ``URL alias`` or the URL."""
    value: Any


@dataclass
class Watch:
    settings: Settings
    urls: list[str]
    headers: dict[str, str]
    model: str
    poll_s: float = 0.5
    seen: list[Seen] = field(default_factory=list)
    errors: int = 0
    _last: dict[tuple[str, str], Any] = field(default_factory=dict)
    _audit_after: str = "0-0"
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="bench-watch", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop polling after one last look."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(15)

    def now(self, what: str, key: str) -> Any:
        """The value of ``what``/``key`` at the last poll (None before it was seen)."""
        return self._last.get((what, key))

    def first(self, what: str, key: str, match: Any = None, after: float = 0.0) -> Seen | None:
        """The first change of ``what``/``key`` seen at or after ``after`` (whose value ``match`` accepts)."""
        for seen in self.seen:
            if seen.what == what and seen.key == key and seen.at >= after and (match is None or match(seen.value)):
                return seen
        return None

    def _run(self) -> None:
        client = redis.Redis.from_url(self.settings.redis_url, decode_responses=True, socket_timeout=5)
        engine = sql_engine(self.settings)
        self._redis, self._loops = client, SqlLoopStore(engine)
        try:
            while not self._stop.is_set():
                self.poll()
                self._stop.wait(self.poll_s)
            self.poll()
        finally:
            client.close()
            engine.dispose()

    def poll(self) -> None:
        for look in (self._audit, self._phase, self._instances):
            try:
                look()
            except Exception:  # a service restarting or busy: the next poll sees the change
                self.errors += 1

    def _note(self, what: str, key: str, value: Any, at: float | None = None) -> None:
        if self._last.get((what, key), object()) != value:
            self._last[(what, key)] = value
            self.seen.append(Seen(time.time() if at is None else at, what, key, value))

    def _audit(self) -> None:
        while True:
            start = f"({self._audit_after}" if self._audit_after != "0-0" else "-"
            entries: list[tuple[str, dict[str, str]]] = self._redis.xrange(STREAM, start, "+", count=2000)  # type: ignore[assignment]  # decode_responses: text
            if not entries:
                return
            for entry_id, fields in entries:
                self._audit_after = entry_id
                if fields.get("type") == SERVED or fields.get("subject", "").lower() != self.model.lower():
                    continue
                data = json.loads(fields.get("data", "{}"))
                self.seen.append(Seen(float(fields["ts"]), "audit", fields["type"], data))

    def _phase(self) -> None:
        record = self._loops.get(self.model)
        if record is not None:
            self._note("phase", "loop", record.phase.value)

    def _instances(self) -> None:
        for url in self.urls:
            entries = httpx.get(f"{url}/v1/models", headers=self.headers, timeout=2).json()
            for entry in entries:
                if entry["model"] == self.model and entry["alias"]:
                    self._note("serving", f"{url} {entry['alias']}", entry["version"])
            split = httpx.get(f"{url}/v1/traffic/{self.model}", headers=self.headers, timeout=2).json()
            self._note("split", url, split.get("weights"))


def flow_runs(api: str, names: tuple[str, ...] = ("retrain", "canary-analysis")) -> list[dict[str, Any]]:
    """Every run of the flows ``names``, oldest first: flow, name, state, start and end (UNIX seconds)."""
    with httpx.Client(base_url=api.rstrip("/"), timeout=10) as client:
        flows = client.post("/flows/filter", json={"flows": {"name": {"any_": list(names)}}}).json()
        by_id = {flow["id"]: flow["name"] for flow in flows}
        runs = client.post("/flow_runs/filter", json={"flows": {"id": {"any_": list(by_id)}}}).json()
    rows = [
        {
            "flow": by_id.get(run["flow_id"], "?"),
            "name": run["name"],
            "state": run.get("state_name") or run.get("state_type"),
            "start": _when(run.get("start_time")),
            "end": _when(run.get("end_time")),
            "parameters": run.get("parameters", {}),
        }
        for run in runs
    ]
    return sorted(rows, key=lambda row: row["start"] or float("inf"))


def _when(text: str | None) -> float | None:
    return None if text is None else datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def last_retrain_request(settings: Settings, model: str) -> dict[str, Any] | None:
    """The retrain outbox's record of ``model``'s last request (``monitoring.retrain.LAST``), or None."""
    client = redis.Redis.from_url(settings.redis_url, decode_responses=True, socket_timeout=5)
    try:
        text = client.hget(LAST, model.lower())
    finally:
        client.close()
    return None if text is None else dict(json.loads(str(text)))
