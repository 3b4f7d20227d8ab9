"""The supervisor's restart policy: ``RestartBudget`` on an injected clock, ``Keeper`` over steerable fake processes."""

from __future__ import annotations

from pathlib import Path

import pytest

from examlops.core.control_sections import UpSettings
from examlops.core.errors import ServiceExited, ServiceStartFailed
from examlops.platform.keeper import Keeper
from examlops.platform.restarts import RestartBudget
from examlops.platform.services import ServiceSpec
from examlops.platform.up_state import ServiceRecord

POLICY = UpSettings(restart_limit=3, restart_window_s=60, restart_backoff_s=1, restart_backoff_cap_s=4)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class FakeProcess:
    """Steer with ``die(code)``, ``ready`` and ``dies_on_start``; records starts and stops."""

    def __init__(self) -> None:
        self.running, self.ready, self.dies_on_start = True, True, False
        self.code: int | None = None
        self.pid = 100
        self.starts = self.stops = 0
        self.log_path = Path("/dev/null")

    @property
    def pgid(self) -> int:
        return self.pid

    @property
    def returncode(self) -> int | None:
        return None if self.running else self.code

    def die(self, code: int = -9) -> None:
        self.running, self.code = False, code

    def alive(self) -> bool:
        return self.running

    def start(self) -> None:
        self.starts += 1
        self.pid += 1
        self.running, self.code = not self.dies_on_start, (None if not self.dies_on_start else 1)

    def check_ready(self) -> bool:
        if not self.running:
            raise ServiceStartFailed("exited while starting")
        return self.ready

    def stop(self, grace: float | None = None) -> int | None:
        self.stops += 1
        self.running = False
        return self.code

    def log_tail(self, lines: int = 20) -> str:
        return "last words"


def keeper(clock: Clock, **processes: FakeProcess) -> tuple[Keeper, dict[str, ServiceRecord], list[str]]:
    specs = [
        ServiceSpec(name, name, "url", process=proc, essential=name != "mlflow")  # type: ignore[arg-type]
        for name, proc in processes.items()
    ]
    records = {s.name: ServiceRecord(s.name, s.title, s.url, state="running") for s in specs}
    said: list[str] = []
    return (
        Keeper(specs, records, POLICY, say=said.append, save=lambda: None, ready_timeout=30, clock=clock),
        records,
        said,
    )


def advance(k: Keeper, clock: Clock, seconds: float) -> None:
    clock.now += seconds
    k.tick()


def test_budget_backs_off_doubling_to_the_cap_then_says_the_service_keeps_failing() -> None:
    clock = Clock()
    budget = RestartBudget(POLICY, clock)
    assert [budget.exited() for _ in range(3)] == [1, 2, 4]
    assert budget.exited() is None
    assert budget.restarts == 3


def test_budget_forgets_exits_older_than_the_window() -> None:
    clock = Clock()
    budget = RestartBudget(POLICY, clock)
    for _ in range(3):
        budget.exited()
    clock.now += 61
    assert budget.exited() == 1 and budget.recent == 1


def test_a_killed_service_is_restarted_after_the_backoff_and_is_running_again() -> None:
    clock, serving = Clock(), FakeProcess()
    k, records, said = keeper(clock, serving=serving)
    serving.die(-9)
    k.tick()
    assert records["serving"].state == "restarting" and records["serving"].last_exit == -9
    assert serving.stops == 1  # what was left of its group was ended before the restart
    assert "restarting in 1 s" in said[-1]
    advance(k, clock, 0.5)
    assert serving.starts == 0
    advance(k, clock, 0.6)
    assert serving.starts == 1 and records["serving"].state == "starting" and records["serving"].pid == 101
    advance(k, clock, 0.1)
    assert records["serving"].state == "running" and records["serving"].restarts == 1
    assert "serving is back" in said[-1]


def test_a_clean_exit_nobody_asked_for_is_restarted_too() -> None:
    clock, bridge = Clock(), FakeProcess()
    k, records, _ = keeper(clock, bridge=bridge)
    bridge.die(0)
    k.tick()
    assert records["bridge"].state == "restarting"


def test_an_essential_service_that_keeps_failing_stops_the_platform_naming_it() -> None:
    clock, redis = Clock(), FakeProcess()
    redis.dies_on_start = True
    k, records, _ = keeper(clock, redis=redis)
    redis.die(-9)
    with pytest.raises(ServiceExited, match=r"redis exited unexpectedly .* keeps failing: 4 exits") as raised:
        for _ in range(20):
            advance(k, clock, 5)
    assert raised.value.log_tail == "last words"
    assert records["redis"].state == "failed" and redis.starts == 3


def test_a_ui_only_service_that_keeps_failing_is_left_stopped_and_serving_goes_on() -> None:
    clock, mlflow, serving = Clock(), FakeProcess(), FakeProcess()
    mlflow.dies_on_start = True
    k, records, said = keeper(clock, mlflow=mlflow, serving=serving)
    mlflow.die(-9)
    for _ in range(20):
        advance(k, clock, 5)
    assert records["mlflow"].state == "failed" and records["serving"].state == "running"
    assert mlflow.starts == 3 and serving.stops == 0
    assert any("not needed for serving" in line for line in said)


def test_a_restart_that_never_gets_ready_counts_as_an_exit() -> None:
    clock, flows = Clock(), FakeProcess()
    k, records, _ = keeper(clock, flows=flows)
    flows.die(1)
    k.tick()
    flows.ready = False
    advance(k, clock, 1)  # restarted
    advance(k, clock, 31)  # past ready_timeout
    assert records["flows"].state == "restarting" and flows.stops == 2


def test_a_service_that_never_gets_ready_is_given_up_however_slowly_each_start_fails() -> None:
    clock, flows = Clock(), FakeProcess()
    k, records, _ = keeper(clock, flows=flows)
    flows.die(1)
    k.tick()
    flows.ready = False
    with pytest.raises(ServiceExited, match="not ready within"):
        for _ in range(40):  # each failed start takes longer than the window: a window alone never says no
            advance(k, clock, 4)  # the backoff, then restarted
            advance(k, clock, 61)  # past ready_timeout and past the window
    assert records["flows"].state == "failed" and records["flows"].restarts == 1 + POLICY.restart_limit


def test_a_start_that_became_ready_forgets_the_failed_ones() -> None:
    clock = Clock()
    budget = RestartBudget(POLICY, clock)

    def failed_start() -> float | None:
        clock.now += 100  # each one outside the window of the last
        return budget.exited(ready=False)

    assert [failed_start() is not None for _ in range(POLICY.restart_limit)] == [True] * 3
    budget.ready()
    assert failed_start() is not None
    assert [failed_start() is not None for _ in range(3)] == [True, True, False]
