"""The supervisor over steerable fake processes: a stop signalled while the keeper restarts a service stops that
service too and starts nothing more; a UI-only service that fails its very first start never stops the rest."""

from __future__ import annotations

import io
import os
import signal
from collections.abc import Callable
from pathlib import Path

from rich.console import Console

from examlops.core.control_sections import UpSettings
from examlops.core.errors import ServiceStartFailed
from examlops.core.settings import Settings
from examlops.platform.services import ServiceSpec
from examlops.platform.supervisor import Supervisor
from examlops.platform.up_state import UpState


class Child:
    """A fake process; ``children`` counts what it has spawned and not stopped, as an OS would."""

    def __init__(self, name: str, *, on_start: Callable[[Child], None] | None = None) -> None:
        self.name = name
        self.on_start = on_start
        self.children = self.starts = 0
        self.running, self.fails_to_start = False, False
        self.on_tick: Callable[[], None] = lambda: None
        self.pid: int | None = None
        self.log_path = Path("/dev/null")
        self.ended_leftovers = False
        self.stop_grace = 10.0

    @property
    def pgid(self) -> int | None:
        return self.pid

    @property
    def returncode(self) -> int | None:
        return None if self.running else 1

    def alive(self) -> bool:
        self.on_tick()
        return self.running

    def start(self) -> None:
        self.starts += 1
        if self.fails_to_start:
            self.running = False
            return
        self.children += 1  # forked: from here the child runs whatever happens to this call
        if self.on_start is not None:
            self.on_start(self)
        self.pid, self.running = 1000 + self.starts, True  # recorded: stop() can end it

    def die(self) -> None:
        self.children -= self.running
        self.running = False

    def check_ready(self) -> bool:
        if not self.running:
            raise ServiceStartFailed(f"{self.name} exited with code 1 while starting")
        return True

    def stop(self, grace: float | None = None) -> int | None:
        if self.running:
            self.children -= 1
        self.running = False
        return 0

    def log_tail(self, lines: int = 20) -> str:
        return ""


def supervisor(tmp_path: Path, *children: Child, limit: int = 5) -> tuple[Supervisor, io.StringIO]:
    up = UpSettings(restart_limit=limit, restart_backoff_s=0.01, restart_backoff_cap_s=0.01)
    out = io.StringIO()
    sup = Supervisor(Settings(home=tmp_path, up=up), services=["redis"], console=Console(file=out), poll_interval=0.01)
    sup.specs = [
        ServiceSpec(child.name, child.name, "url", process=child, essential=child.name != "mlflow")  # type: ignore[arg-type]
        for child in children
    ]
    sup._records = {}
    sup.state.services = []
    from examlops.platform.supervisor import _record

    for spec in sup.specs:
        record = _record(spec)
        sup.state.services.append(record)
        sup._records[spec.name] = record
    return sup, out


def _sigterm_self(_: Child) -> None:
    os.kill(os.getpid(), signal.SIGTERM)


def test_a_stop_signalled_while_a_service_restarts_stops_it_and_restarts_nothing_more(tmp_path: Path) -> None:
    redis, serving = Child("redis"), Child("serving")

    def both_die() -> None:
        if redis.starts == 1 and serving.starts == 1:
            redis.die()  # both exit; the keeper restarts redis first
            serving.die()

    redis.on_tick = both_die
    sup, _ = supervisor(tmp_path, redis, serving)
    # The restart of redis is where the stop lands, between its fork and its bookkeeping.
    redis.on_start = lambda child: _sigterm_self(child) if child.starts == 2 else None
    assert sup.run() == "SIGTERM"
    assert redis.starts == 2 and redis.children == 0  # the restarted redis was known, and stopped
    assert serving.starts == 1 and serving.children == 0  # due for a restart too, but not once the stop began


def test_a_ui_service_that_fails_its_first_start_is_retried_then_left_failed_while_the_rest_runs(
    tmp_path: Path,
) -> None:
    redis, mlflow = Child("redis"), Child("mlflow")
    mlflow.fails_to_start = True
    sup, out = supervisor(tmp_path, redis, mlflow, limit=2)
    states: list[str] = []

    def watch() -> None:
        state = sup._records["mlflow"].state
        if not states or states[-1] != state:
            states.append(state)
        if state == "failed":
            _sigterm_self(redis)

    redis.on_tick = watch
    assert sup.run() == "SIGTERM"  # stopped by the test, not by the UI's failures
    assert mlflow.starts == 3  # the first start, then the two restarts the budget allows
    assert states[-1] == "failed" and redis.starts == 1
    assert "left stopped: mlflow is not needed for serving" in out.getvalue()


class StuckChild(Child):
    """A fake process whose stop raises (a process that cannot be signalled)."""

    def stop(self, grace: float | None = None) -> int | None:
        raise PermissionError("operation not permitted")


def test_a_stop_that_raises_and_a_state_file_that_cannot_be_written_stop_nothing_else(tmp_path: Path) -> None:
    redis, serving, bridge = Child("redis"), StuckChild("serving"), Child("bridge")
    sup, out = supervisor(tmp_path, redis, serving, bridge)
    failed: list[str] = []

    def save() -> None:
        if sup.state.state == "stopping" and not failed:  # the stop's first save fails, its last one works
            failed.append("up.json")
            raise OSError("disk full")
        sup.state.write(sup.run_dir)

    sup._save = save  # type: ignore[method-assign]
    bridge.on_tick = lambda: _sigterm_self(bridge)
    assert sup.run() == "SIGTERM"
    assert not redis.running and not bridge.running  # stopped although serving's stop raised before redis's
    assert "could not stop serving: operation not permitted" in out.getvalue()
    assert "could not write up.json" in out.getvalue()
    kept = UpState.read(sup.run_dir)
    assert kept is not None and [r.name for r in kept.services] == ["serving"]  # for `exa down` to end
