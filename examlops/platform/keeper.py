"""Keeping `exa up`'s services running once they have started: ``Keeper.tick()``, called by the supervisor's loop.

Contract, per service, on each ``tick``:

- a service whose main process has exited, whatever its exit code (nobody asked it to stop: the supervisor
  stops calling ``tick`` before it stops anything), has what is left of its process group ended, then is
  restarted after the delay its ``RestartBudget`` gives (``up.restart_*`` settings). Each exit and each
  return is said through ``say`` and recorded in ``up.json`` (``state`` ``restarting``, then ``starting``,
  then ``running``; ``restarts``, ``last_exit``) for ``exa status``;
- a restarted service that dies before it is ready, or is not ready within ``ready_timeout``, counts as
  another exit;
- a service that keeps failing (its budget says no) ends the platform: ``tick`` raises ``ServiceExited``
  with its log tail. Except a service that is not ``essential`` (the MLflow UI: serving reads the
  registry's store itself): it is left stopped, marked ``failed``, and the rest keeps running.

Nothing is (re)started once ``stopping()`` says the platform is being stopped: a restart due then is dropped.
``start_failed(name, why)`` hands over a service whose first start failed (the supervisor does so for one
that is not ``essential``): it is treated as a restart that never became ready.

A restart does not restart the services that depend on it: their clients reconnect (Redis, serving over
HTTP), and one that dies of the outage is restarted in turn.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from examlops.core.control_sections import UpSettings
from examlops.core.errors import ServiceExited, ServiceStartFailed
from examlops.platform.leftovers import stamp
from examlops.platform.restarts import RestartBudget
from examlops.platform.services import ServiceSpec
from examlops.platform.up_state import ServiceRecord


@dataclass
class _Phase:
    budget: RestartBudget
    restart_at: float | None = None
    starting_since: float | None = None
    exited_at: float = field(default=0.0)


class Keeper:
    """Restarts what exits; see the module docstring. ``save`` writes ``up.json``."""

    def __init__(
        self,
        specs: Sequence[ServiceSpec],
        records: dict[str, ServiceRecord],
        policy: UpSettings,
        *,
        say: Callable[[str], None],
        save: Callable[[], None],
        ready_timeout: float,
        clock: Callable[[], float] = time.monotonic,
        stopping: Callable[[], bool] = lambda: False,
    ) -> None:
        self.specs = [spec for spec in specs if spec.process is not None]
        self.records = records
        self.policy = policy
        self.say = say
        self.save = save
        self.ready_timeout = ready_timeout
        self.clock = clock
        self.stopping = stopping
        self._phases = {spec.name: _Phase(RestartBudget(policy, clock)) for spec in self.specs}

    def start_failed(self, name: str, why: str) -> None:
        """``name``'s first start failed (``why``): stop what is left of it, then retry it as a restart."""
        spec = next(spec for spec in self.specs if spec.name == name)
        phase = self._phases[name]
        phase.exited_at = self.clock()
        self._exited(spec, phase, ready=False, why=why)

    def tick(self) -> None:
        for spec in self.specs:
            if self.stopping():
                return  # the platform is being stopped: start nothing more
            record, phase = self.records[spec.name], self._phases[spec.name]
            if record.state == "failed":
                continue  # a UI-only service given up on
            if phase.restart_at is not None:
                if self.clock() >= phase.restart_at:
                    self._restart(spec, phase)
            elif phase.starting_since is not None:
                self._check_started(spec, phase)
            else:
                assert spec.process is not None
                if not spec.process.alive():
                    self._exited(spec, phase)

    def _check_started(self, spec: ServiceSpec, phase: _Phase) -> None:
        assert spec.process is not None and phase.starting_since is not None
        try:
            ready = spec.process.check_ready()
        except ServiceStartFailed:
            self._exited(spec, phase, ready=False)
            return
        waited = self.clock() - phase.starting_since
        if ready:
            record = self.records[spec.name]
            record.state, record.ready_after_s, phase.starting_since = "running", round(waited, 1), None
            phase.budget.ready()
            self.save()
            down = self.clock() - phase.exited_at
            self.say(f"[green]✓[/] {spec.name} is back (ready in {waited:.1f} s, {down:.1f} s after it exited)")
        elif waited > self.ready_timeout:
            self._exited(spec, phase, ready=False, why=f"not ready within {self.ready_timeout:g} s")  # stops it

    def _exited(self, spec: ServiceSpec, phase: _Phase, *, ready: bool = True, why: str = "") -> None:
        assert spec.process is not None
        record = self.records[spec.name]
        code = spec.process.returncode
        spec.process.stop()  # its main process is gone: this ends the rest of its group (a killed mlflow's uvicorn)
        code = code if code is not None else spec.process.returncode
        phase.exited_at, phase.starting_since = self.clock(), None
        delay = phase.budget.exited(ready=ready)
        record.last_exit = code
        if delay is None:
            record.state = "failed"
            self.save()
            why = (
                f"{spec.name} {why or f'exited unexpectedly with code {code}'} and keeps failing: "
                f"{phase.budget.recent} exits within {self.policy.restart_window_s:g} s (log: {spec.process.log_path})"
            )
            if spec.essential:
                raise ServiceExited(why, log_tail=spec.process.log_tail())
            self.say(f"[bold red]{why}[/]; left stopped: {spec.title} is not needed for serving")
            return
        record.state, record.restarts = "restarting", phase.budget.restarts
        phase.restart_at = self.clock() + delay
        self.save()
        self.say(
            f"[yellow]{spec.name} {why or f'exited unexpectedly with code {code}'}:[/] restarting in {delay:g} s "
            f"(restart {phase.budget.restarts}; at most {self.policy.restart_limit} "
            f"within {self.policy.restart_window_s:g} s)"
        )

    def _restart(self, spec: ServiceSpec, phase: _Phase) -> None:
        assert spec.process is not None
        if self.stopping():
            return
        phase.restart_at = None
        try:
            spec.process.start()
        except ServiceStartFailed:
            self._exited(spec, phase, ready=False)
            return
        record = self.records[spec.name]
        record.pid, record.pgid, record.state = spec.process.pid, spec.process.pgid, "starting"
        record.stamp = stamp(record.pgid)
        phase.starting_since = self.clock()
        self.save()
