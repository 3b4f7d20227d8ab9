"""Child processes: started with multiprocessing, at a lower priority, stopped with a timeout, kept alive.

Shared by the predict pool's workers and the bridge's recording child.

- ``CONTEXT`` is the "spawn" context: the parents run event loops and threads, so fork is unsafe.
- ``warm_context(preload)`` is a "forkserver" context instead, where the platform has one: a clean
  single-threaded server process imports ``preload`` once and forks every child from itself, so a child
  starts with those modules in memory (shared copy-on-write) and none of its parent's threads. Spawn where
  there is no forkserver (Windows). The server and its children ignore SIGTERM, which a stop of the parent's
  whole process group sends them too: the parent stops them. ``warm_up(context)`` waits until that server
  has imported them; ``stop_warm_server(context)`` stops it and waits for its exit.
- ``start_child(target, args, name=..., context=...)`` returns a started daemon process; ``OSError`` when it
  cannot start.
- ``stop_child(process, timeout_s, ask=...)`` sends SIGTERM when ``ask`` (else only waits: a child that
  exits by itself, on EOF), SIGKILLs it after ``timeout_s``, reaps it and releases its handles; its exit
  code (negative: the signal that ended it).
- In the child: ``lower_priority(nice)`` once its start-up is done (start-up at normal priority, so a busy
  machine does not leave a new child starting for long), ``exit_with_parent(pid)`` (a thread that ends
  the child within ``PARENT_CHECK_S`` of its parent's death, even mid-work; a forkserver's child sees the
  server as its parent, so it watches both: the server exits when the parent does).
- ``Heartbeat`` and ``Flag``: shared memory between parent and child (a time the child sets; a flag the
  parent sets), so neither a lock nor a pipe can leave one side waiting on a dead other.
- ``KeptAlive`` supervises one long-lived child: ``check()`` (call it periodically) starts it again after
  it exited or went silent (its heartbeat, ``Heartbeat``, stopped moving for ``silence_s``), after a delay
  that doubles while children keep dying young. The clock is injected.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import sys
import threading
import time
from collections.abc import Callable, Sequence
from multiprocessing.context import ForkServerContext, SpawnContext
from multiprocessing.process import BaseProcess
from typing import Any, NoReturn, Protocol

from examlops.core.backoff import Backoff

log = logging.getLogger(__name__)

ChildContext = SpawnContext | ForkServerContext
CONTEXT: ChildContext = multiprocessing.get_context("spawn")
PARENT_CHECK_S = 0.5
KILL_WAIT_S = 5.0
RESTART = Backoff(1.0, 30.0)
"""The delay before a child is started again, doubling while children keep dying young."""


IGNORE_SIGTERM = "examlops.core.fork_server_signals"
"""Preloaded last by every warm fork server: it and its children ignore SIGTERM (the parent owns shutdown)."""


def warm_context(preload: Sequence[str]) -> ChildContext:
    """A context whose children fork from a server that imported ``preload`` (and the main module) once; the
    server and its children ignore SIGTERM (``fork_server_signals``)."""
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return CONTEXT
    context = multiprocessing.get_context("forkserver")
    main = getattr(sys.modules["__main__"], "__spec__", None)
    # A child imports the parent's main module by name when it is not the server's (python -m ...): warm it too.
    named_main = [main.name] if main is not None and main.name else []
    context.set_forkserver_preload(["__main__", *named_main, *preload, IGNORE_SIGTERM])
    return context


def warm_up(context: ChildContext) -> None:
    """Start ``context``'s fork server and wait until it imported its modules (blocks: call it off the loop)."""
    process = context.Process(target=exit_now, args=(0,), name="examlops-warm-up", daemon=True)
    process.start()
    process.join()
    process.close()


def stop_warm_server(context: ChildContext) -> None:
    """Stop ``context``'s fork server if it runs and wait for its exit (blocks: call it off the loop); a later
    start starts a new one. The server exits by itself once its parent has, but a moment later (seconds on a
    busy machine), so a parent that stops its own children stops it too."""
    if context.get_start_method() != "forkserver":
        return
    from multiprocessing import forkserver

    server = getattr(forkserver, "_forkserver", None)
    stop = getattr(server, "_stop", None)  # CPython's own, there for its tests; absent elsewhere
    if stop is not None:
        stop()


def start_child(
    target: Callable[..., object], args: Sequence[Any], *, name: str, context: ChildContext = CONTEXT
) -> BaseProcess:
    """A started daemon process running ``target(*args)`` (its arguments are pickled: no secrets in them)."""
    process = context.Process(target=target, args=tuple(args), name=name, daemon=True)
    process.start()
    return process


def stop_child(process: BaseProcess, timeout_s: float, *, ask: bool = True) -> int | None:
    """Stop ``process``: SIGTERM if ``ask``, SIGKILL after ``timeout_s``; reaped and closed. Its exit code."""
    if ask and process.exitcode is None:
        process.terminate()
    process.join(timeout_s)
    if process.exitcode is None:
        process.kill()
        process.join(KILL_WAIT_S)
    code = process.exitcode
    if code is not None:
        process.close()
    return code


def lower_priority(nice: int) -> None:
    """Lower the CPU priority of every thread of this process by ``nice`` (threads started later inherit it).

    Per thread: on Linux a nice value is a thread's, and ``os.nice`` would lower the calling thread only.
    """
    if nice <= 0 or not hasattr(os, "setpriority"):
        return
    for thread in threading.enumerate():
        if thread.native_id is not None:
            now = os.getpriority(os.PRIO_PROCESS, thread.native_id)
            os.setpriority(os.PRIO_PROCESS, thread.native_id, min(19, now + nice))


def exit_with_parent(parent_pid: int) -> None:
    """Start a thread that exits this process once its parent (``parent_pid``) is gone."""

    server = os.getppid()  # the parent itself, or the fork server it asked for this child

    def watch() -> None:
        while os.getppid() == server and (server == parent_pid or _alive(parent_pid)):
            time.sleep(PARENT_CHECK_S)
        exit_now(1)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def _alive(pid: int) -> bool:
    if pid <= 0:  # kill(0 or -1, 0) would ask about a whole group
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def exit_now(code: int) -> NoReturn:
    """Exit without interpreter finalization (slow with sklearn loaded; the child keeps no state to flush)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


class Heartbeat:
    """A time the child sets (``beat``) and its parent reads (``last``); shared memory, no pipe."""

    def __init__(self) -> None:
        self._value = CONTEXT.RawValue("d", time.monotonic())

    def beat(self) -> None:
        self._value.value = time.monotonic()  # CLOCK_MONOTONIC is system-wide: the parent reads the same clock

    def last(self) -> float:
        return float(self._value.value)


class Flag:
    """A flag the parent sets and the child polls; shared memory, no lock (``multiprocessing.Event`` is not
    used: its ``set`` waits for every waiter to wake, forever when one was killed while waiting)."""

    def __init__(self) -> None:
        self._value = CONTEXT.RawValue("b", 0)

    def set(self) -> None:
        self._value.value = 1

    def is_set(self) -> bool:
        return bool(self._value.value)

    def wait(self, poll_s: float = 0.1) -> None:
        """Return once the flag is set (polls every ``poll_s``)."""
        while not self.is_set():
            time.sleep(poll_s)


class Process(Protocol):
    """What ``KeptAlive`` needs of a started process (``multiprocessing``'s, or a fake)."""

    @property
    def pid(self) -> int | None: ...
    @property
    def exitcode(self) -> int | None: ...
    def kill(self) -> None: ...
    def close(self) -> None: ...


class KeptAlive:
    """One child, started by ``start`` and started again when it exits or goes silent.

    ``check()`` does one pass (not thread-safe: call it from one thread). A child that lived less than
    ``stable_s`` counts as a failed start: the delay before the next one doubles (``restart``), and resets
    once a child lives that long. ``stop`` ends supervision: the caller then stops the child itself.
    """

    def __init__(
        self,
        start: Callable[[], Process],
        *,
        name: str,
        heartbeat: Callable[[], float] | None = None,
        silence_s: float = 30.0,
        restart: Backoff = RESTART,
        stable_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._start = start
        self.name = name
        self.heartbeat = heartbeat
        self.silence_s = silence_s
        self.restart = restart
        self.stable_s = stable_s
        self.clock = clock
        self.process: Process | None = None
        self.started = 0
        """Children started so far (the first one included)."""
        self._started_at = 0.0
        self._failures = 0
        self._next_start = 0.0

    @property
    def restarts(self) -> int:
        return max(0, self.started - 1)

    def check(self) -> Process | None:
        """Reap a child that exited or went silent; start one when none runs and the delay has passed."""
        now = self.clock()
        child = self.process
        if child is not None and child.exitcode is None and self._silent(now):
            log.error("the %s (pid %s) went silent for %.0f s; killing it", self.name, child.pid, self.silence_s)
            child.kill()
            return child
        if child is not None and child.exitcode is not None:
            log.error("the %s (pid %s) exited with code %s", self.name, child.pid, child.exitcode)
            self.process = None
            child.close()
            young = now - self._started_at < self.stable_s
            self._failures = self._failures + 1 if young else 1
            self._next_start = now + self.restart.delay(self._failures)
        if self.process is None and now >= self._next_start:
            if self.started:
                log.warning("starting the %s again", self.name)
            try:
                self.process = self._start()
            except OSError:
                log.exception("the %s could not be started", self.name)
                self._failures += 1
                self._next_start = now + self.restart.delay(self._failures)
                return None
            self.started += 1
            self._started_at = now
        return self.process

    def _silent(self, now: float) -> bool:
        if self.heartbeat is None:
            return False
        return now - max(self.heartbeat(), self._started_at) > self.silence_s
