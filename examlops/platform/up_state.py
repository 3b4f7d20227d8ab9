"""The record of one running ``exa up``: ``run_dir/up.json`` and the lock on ``run_dir/up.lock``.

Contracts: ``UpState.write`` is atomic (a reader sees the old document or the new one, never half of
one); ``UpState.read`` gives None when there is no file or it cannot be parsed. ``claim`` takes the lock
(or says who holds it); ``supervisor_running`` asks the kernel whether some process holds the flock, so a
stale pid never misleads it. ``exa status`` and ``exa down`` read these; only the ``Supervisor`` writes them.
"""

from __future__ import annotations

import fcntl
import json
import os
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

from rich.table import Table

from examlops.core.errors import AlreadyRunning
from examlops.platform.leftovers import ours

STATE_FILE = "up.json"
LOCK_FILE = "up.lock"


@dataclass(slots=True)
class ServiceRecord:
    name: str
    title: str
    url: str
    links: list[tuple[str, str]] = field(default_factory=list)
    owned: bool = True
    state: str = "pending"
    """pending, starting, running, restarting, failed, stopped, or external."""
    pid: int | None = None
    pgid: int | None = None
    stamp: str | None = None
    """Its group leader's ``leftovers.stamp``: tells a later ``exa up`` or ``exa down`` that a live group is
    still this service's, not a stranger's under a reused id."""
    port: int | None = None
    log: str | None = None
    health_url: str | None = None
    ready_after_s: float | None = None
    restarts: int = 0
    """Times the supervisor restarted it after it exited on its own."""
    last_exit: int | None = None
    """The exit code of its last unexpected exit (negative: killed by that signal)."""
    essential: bool = True
    stop_grace: float | None = None
    """Seconds its main process gets to stop after its stop signal (`exa down` waits as long for a leftover)."""


@dataclass(slots=True)
class UpState:
    """The content of ``up.json``."""

    supervisor_pid: int
    state_dir: str
    state: str = "starting"
    """starting, ready or stopping."""
    started_at: str = field(default_factory=lambda: datetime.now(UTC).isoformat(timespec="seconds"))
    services: list[ServiceRecord] = field(default_factory=list)

    def write(self, run_dir: Path) -> None:
        """Atomic: a reader sees the old document or the new one, never half of one."""
        run_dir.mkdir(parents=True, exist_ok=True)
        tmp = run_dir / f".{STATE_FILE}.{os.getpid()}"
        tmp.write_text(json.dumps(asdict(self), indent=2) + "\n")
        tmp.replace(run_dir / STATE_FILE)

    @classmethod
    def read(cls, run_dir: Path) -> UpState | None:
        """None when there is no file or it cannot be parsed."""
        try:
            data: dict[str, Any] = json.loads((run_dir / STATE_FILE).read_text())
            services = [
                ServiceRecord(**{**s, "links": [tuple(link) for link in s.get("links", [])]})
                for s in data.pop("services", [])
            ]
            return cls(**data, services=services)
        except (OSError, ValueError, TypeError):
            return None


def url_table(state: UpState, title: str = "examlops is up") -> Table:
    """Every service with its URL and state, and the links under it."""
    table = Table(title=title, title_justify="left")
    table.add_column("service")
    table.add_column("URL")
    table.add_column("state")
    for record in state.services:
        table.add_row(record.title, record.url, record.state)
        for link_title, link_url in record.links:
            table.add_row(f"  {link_title}", link_url, "")
    return table


def supervisor_running(run_dir: Path) -> bool:
    """True while some ``exa up`` holds the lock of this state folder; immune to pid reuse."""
    path = run_dir / LOCK_FILE
    if not path.exists():
        return False
    with path.open("a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(lock, fcntl.LOCK_UN)
        return False


def claim(run_dir: Path, state_dir: Path) -> IO[str]:
    """Take this state folder's ``exa up`` lock and clear a dead supervisor's ``up.json``; the open lock file
    (closing it releases the lock). ``AlreadyRunning`` while another supervisor holds the lock, or while a
    dead one's ``up.json`` names process groups still alive and still its own (`exa down` ends them)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    lock = (run_dir / LOCK_FILE).open("w")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.close()
        other = UpState.read(run_dir)
        pid = f" (pid {other.supervisor_pid})" if other else ""
        raise AlreadyRunning(
            f"exa up is already running{pid} for {state_dir}; see `exa status`, or `exa down`"
        ) from None
    stale = UpState.read(run_dir)
    if stale is not None:
        alive = [r.name for r in stale.services if r.pgid is not None and ours(r.pgid, r.stamp)]
        if alive:
            lock.close()
            raise AlreadyRunning(
                f"a previous exa up (pid {stale.supervisor_pid}) ended without stopping {', '.join(alive)}; "
                "run `exa down` to stop them"
            )
        (run_dir / STATE_FILE).unlink(missing_ok=True)
    return lock
