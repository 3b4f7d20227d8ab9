"""``exa up`` in one object: start every service, show the URLs, stop them all.

``Supervisor(settings).run()`` contract:

- Refuses to start (``AlreadyRunning``) while another supervisor holds
  ``run_dir/up.lock`` (an flock, released by the kernel however that process
  ended), or while a dead one's ``up.json`` names process groups still alive.
- Checks every owned port before starting anything (``PortInUse`` names the
  setting to change).
- Upgrades the SQL schema (``examlops.db.upgrade``; a failure is
  ``ServiceStartFailed``), starts redis, then calls the setup hook, then starts the rest of
  ``services.SERVICE_NAMES`` in waves by ``services.NEEDS`` (mlflow, prefect and serving, then the bus
  bridge and the served Prefect flows; those pointed elsewhere by a URL setting are external and never
  started), each wave once the one before is ready. ``ServiceStartFailed`` carries the log tail of the
  one that failed to start.
- Once all are ready, keeps them running (``keeper.Keeper``): a service that exits on its own is
  restarted with backoff, within ``up.restart_limit`` per ``up.restart_window_s``, and said so on the
  output and in ``up.json``; one that keeps failing raises ``ServiceExited``, except the MLflow UI
  (not ``essential``), which is then left stopped while the rest keeps serving. A service that is not
  essential and fails its very first start (exits, or is not ready within ``ready_timeout``) does not stop
  the start either: it is handed to the keeper as a failed start (retried with backoff, then ``failed``).
- Keeps ``run_dir/up.json`` current (``up_state.UpState``: supervisor pid,
  state, and per service pid, pgid and its leader's stamp, URL, log, state, restarts) for ``exa status`` and
  ``exa down``.
- Returns the signal's name after SIGINT, SIGTERM or SIGHUP. A signal that lands while a process is being
  started (at first start, or by the keeper's restart) takes effect once that start has returned and is
  recorded, so the stop always knows, and stops, every process started; once a stop has begun, the keeper
  starts nothing more.
- Whatever happened, every process it started is stopped in reverse start order (dependents first),
  each with ``ManagedProcess.stop``: its main process is signalled and given its grace to finish its
  own way (serving drains its requests in flight, then stops its predict workers), and only then is
  the rest of its process group ended; ``up.json`` is removed before ``run`` returns or raises. A state
  file that cannot be written or one stop that raises stops nothing else; a service whose stop raised
  is kept in ``up.json`` for `exa down` to end.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Collection
from pathlib import Path
from typing import IO

from rich.console import Console

from examlops.core.errors import ExamlopsError, ServiceStartFailed
from examlops.core.settings import Settings
from examlops.db import upgrade
from examlops.platform.keeper import Keeper
from examlops.platform.leftovers import stamp
from examlops.platform.process import ensure_port_free
from examlops.platform.services import LOCALHOST, ServiceSpec, build_specs
from examlops.platform.stop_signals import StopRequested, StopSignals
from examlops.platform.up_state import STATE_FILE, ServiceRecord, UpState, claim, url_table

Progress = Callable[[str], None]
SetupHook = Callable[[Settings, Progress], None]
"""Runs after redis is ready and before the other services start (``bootstrap.prepare_platform``)."""


def _record(spec: ServiceSpec) -> ServiceRecord:
    return ServiceRecord(
        spec.name,
        spec.title,
        spec.url,
        list(spec.links),
        owned=spec.owned,
        state="pending" if spec.owned else "external",
        port=spec.port,
        log=str(spec.process.log_path) if spec.process else None,
        health_url=spec.health_url,
        essential=spec.essential,
        stop_grace=spec.process.stop_grace if spec.process else None,
    )


class Supervisor:
    """Owns every process of one ``exa up``; see the module docstring for the contract."""

    def __init__(
        self,
        settings: Settings,
        *,
        services: Collection[str] | None = None,
        setup: SetupHook | None = None,
        console: Console | None = None,
        ready_timeout: float = 180.0,
        poll_interval: float = 0.5,
    ) -> None:
        self.settings = settings
        self.specs = build_specs(settings, services)
        self.setup = setup
        self.console = console or Console()
        self.ready_timeout = ready_timeout
        self.poll_interval = poll_interval
        self.state = UpState(os.getpid(), str(settings.state_dir), services=[_record(s) for s in self.specs])
        self._records = {r.name: r for r in self.state.services}
        self._started: list[ServiceSpec] = []
        self._first_failures: list[tuple[ServiceSpec, str]] = []
        """Services that are not essential and failed their first start: the keeper retries them."""
        self.signals = StopSignals()
        self._lock: IO[str] | None = None

    @property
    def run_dir(self) -> Path:
        return self.settings.run_dir

    def run(self) -> str:
        """Start, print the URLs, wait; returns the name of the signal that stopped it."""
        self._claim()
        with self.signals.installed():
            return self._run()

    def _run(self) -> str:
        try:
            self._start_all()
            keeper = self._keeper()
            with self.signals.atomic():
                for spec, why in self._first_failures:
                    keeper.start_failed(spec.name, why)
            self.state.state = "ready"
            self._save()
            self.console.print(url_table(self.state))
            self.console.print(f"logs in {self.settings.log_dir}; Ctrl-C or `exa down` stops everything")
            self._watch(keeper)
        except StopRequested as stop:
            self.console.print(f"{stop.signame} received: stopping")
            return stop.signame
        finally:
            try:
                self._shutdown()
            except StopRequested:  # the first signal landed before _shutdown marked us as stopping
                self._shutdown()
        raise AssertionError("unreachable: _watch only leaves by raising")

    def _claim(self) -> None:
        self._lock = claim(self.run_dir, self.settings.state_dir)
        self._save()

    def _release(self) -> None:
        if self._lock is not None:
            self._lock.close()  # closing the file drops the flock
            self._lock = None

    def _save(self) -> None:
        self.state.write(self.run_dir)

    def _start_all(self) -> None:
        owned = [s for s in self.specs if s.process is not None]
        for spec in owned:
            if spec.port is not None:  # the flows service listens on no port
                ensure_port_free(LOCALHOST, spec.port, what=spec.title, setting=spec.port_setting)
        try:  # once here, so that no service starts on a schema that is not current
            schema = upgrade(self.settings.sql_url).after
        except ExamlopsError as exc:
            raise ServiceStartFailed(f"the SQL schema could not be upgraded: {exc}") from exc
        self.console.print(f"[green]✓[/] SQL schema at revision {schema.revision} ({schema.url})", highlight=False)
        first = [s for s in owned if s.name == "redis"]
        self._start_group(first)
        if self.setup is not None:
            self.console.print("preparing the platform (MLflow store, demo models)")
            t0 = time.monotonic()
            self.setup(self.settings, lambda line: self.console.print(f"  {line}", highlight=False))
            self.console.print(f"[green]✓[/] platform prepared ({time.monotonic() - t0:.1f} s)")
        ours = {s.name for s in owned}
        ready = {s.name for s in first}
        rest = [s for s in owned if s.name != "redis"]
        while rest:
            # A need that is not ours (external, or left out with --skip) is not waited for.
            wave = [s for s in rest if all(n in ready or n not in ours for n in s.needs)]
            if not wave:
                raise ServiceStartFailed(f"services whose needs cannot be met: {', '.join(s.name for s in rest)}")
            self._start_group(wave)
            ready.update(s.name for s in wave)
            rest = [s for s in rest if s not in wave]

    def _start_group(self, specs: list[ServiceSpec]) -> None:
        """Start every spec, then wait for all of them together; the first failure raises."""
        if not specs:
            return
        t0 = time.monotonic()
        pending = list(specs)
        with self.signals.atomic():
            for spec in specs:
                assert spec.process is not None
                record = self._records[spec.name]
                record.state = "starting"
                self._started.append(spec)
                try:
                    spec.process.start()
                except ServiceStartFailed as exc:
                    if spec.essential:
                        raise
                    self._first_failures.append((spec, f"could not be started ({exc})"))
                    pending.remove(spec)
                    continue
                record.pid, record.pgid = spec.process.pid, spec.process.pgid
                record.stamp = stamp(record.pgid)
            self._save()
        with self.console.status("") as status:
            while pending:
                waited = time.monotonic() - t0
                status.update(f"starting {', '.join(s.name for s in pending)} ({waited:.0f} s)")
                for spec in list(pending):
                    assert spec.process is not None
                    try:
                        ready = spec.process.check_ready()
                    except ServiceStartFailed:
                        if spec.essential:
                            raise
                        self._first_failures.append((spec, f"exited with code {spec.process.returncode} at start"))
                        pending.remove(spec)
                        continue
                    if ready:
                        pending.remove(spec)
                        record = self._records[spec.name]
                        record.state, record.ready_after_s = "running", round(time.monotonic() - t0, 1)
                        self._save()
                        self.console.print(f"[green]✓[/] {spec.name} ready in {record.ready_after_s} s at {spec.url}")
                if pending and waited > self.ready_timeout:
                    late = [s for s in pending if not s.essential]
                    self._first_failures += [(s, f"not ready within {self.ready_timeout:g} s") for s in late]
                    pending = [s for s in pending if s.essential]
                if pending and waited > self.ready_timeout:
                    spec = pending[0]
                    assert spec.process is not None
                    raise ServiceStartFailed(
                        f"{spec.name} was not ready after {self.ready_timeout:.0f} s (log: {spec.process.log_path})",
                        log_tail=spec.process.log_tail(),
                    )
                if pending:
                    time.sleep(0.2)

    def _keeper(self) -> Keeper:
        return Keeper(
            self._started,
            self._records,
            self.settings.up,
            say=lambda line: self.console.print(line, highlight=False),
            save=self._save,
            ready_timeout=self.ready_timeout,
            stopping=lambda: self.signals.stopping,
        )

    def _watch(self, keeper: Keeper) -> None:
        while True:
            time.sleep(self.poll_interval)
            with self.signals.atomic():
                keeper.tick()

    def _shutdown(self) -> None:
        """Stop every started service, dependents first. Best effort throughout: a state file that cannot be
        written, or one service's stop that raises, never keeps the others running. A service whose stop
        raised stays in ``up.json`` (with its pid and group) for `exa down` to end; with none, the file goes."""
        self.signals.stopping = True
        survivors: list[str] = []
        try:
            self.state.state = "stopping"
            self._try_save()
            for spec in reversed(self._started):
                assert spec.process is not None
                t0 = time.monotonic()
                try:
                    with self.console.status(f"stopping {spec.name}"):
                        code = spec.process.stop()
                except Exception as exc:  # the others are stopped all the same
                    survivors.append(spec.name)
                    self.console.print(f"[red]✗[/] could not stop {spec.name}: {exc}", highlight=False)
                    continue
                self._records[spec.name].state = "stopped"
                left = "; ended what was left of its process group" if spec.process.ended_leftovers else ""
                self.console.print(f"stopped {spec.name} (exit {code}, {time.monotonic() - t0:.1f} s{left})")
        finally:
            if survivors:
                self.state.services = [r for r in self.state.services if r.name in survivors]
                self._try_save()
                self.console.print(f"left running: {', '.join(survivors)} (`exa down` ends them)", highlight=False)
            else:
                with contextlib.suppress(OSError):
                    (self.run_dir / STATE_FILE).unlink()
            self._release()

    def _try_save(self) -> None:
        try:
            self._save()
        except OSError as exc:
            self.console.print(f"[yellow]![/] could not write {STATE_FILE}: {exc}", highlight=False)
