"""One child process that examlops starts, watches and stops: ``ManagedProcess``.

Contract:

- ``start()`` launches ``argv`` in a new session (so it leads its own process
  group), stdout and stderr through a pipe into ``log_path``, rotated by size
  (``log_pump.LogPump``: ``log_max_bytes``, ``log_backups``; the previous run's
  log is rotated to ``<name>.log.1``). A missing program raises ``ServiceStartFailed``.
- ``check_ready()`` polls the health check once; ``wait_ready(timeout)``
  polls until it answers. The process dying first raises
  ``ServiceStartFailed`` with the tail of its log; running past ``timeout``
  raises ``ServiceStartFailed`` too.
- ``stop(grace)`` signals the main process alone (``stop_signal``, SIGTERM by
  default) and waits up to ``grace`` seconds for it to exit, so that it stops
  its own children its own way (serving drains, and only then stops its
  predict workers). Then it ends what is left of the group: SIGTERM, up to
  ``LEFTOVER_GRACE_S``, SIGKILL. That second step matters: ``mlflow server``
  forks uvicorn, and a SIGTERM to its pid alone orphans the workers. It is
  idempotent and never raises for a process that is already gone. When that
  second step had anything to end (after ``LEFTOVER_SETTLE_S`` for children
  that exit with their parent) it logs a warning naming them and sets
  ``ended_leftovers`` (a service that stops its own children never does).

The platform's errors live in ``examlops.core.errors`` with the rest of the
family; this is their branch of its tree::

    ExamlopsError
    └── ServiceError                    `exa up` could not run a service
        ├── PortInUse                   a port it needs is taken (names the setting to change)
        ├── ServiceStartFailed          a service did not become ready (carries its log tail)
        │   └── ServiceExited           a service exited on its own
        └── AlreadyRunning (Conflict)   another `exa up` owns this state folder
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from urllib.parse import urlsplit

from examlops.core.errors import PortInUse, ServiceStartFailed
from examlops.core.settings import LogSettings
from examlops.platform.log_pump import LogPump

log = logging.getLogger(__name__)

LEFTOVER_GRACE_S = 5.0
"""Seconds what is left of a group after its main process exited gets between SIGTERM and SIGKILL."""
LEFTOVER_SETTLE_S = 2.0
"""Seconds what is left of a group after its main process exited gets to exit on its own, before the SIGTERM."""

HealthCheck = str | Callable[[], bool]
"""An ``http(s)://`` URL that must answer below 400, a ``redis://`` URL that must PING, or a callable."""


def probe(check: HealthCheck, timeout: float = 1.0) -> bool:
    """Ask a health check once; any error or refusal is ``False``, never an exception."""
    if callable(check):
        try:
            return check()
        except Exception:
            return False
    scheme = urlsplit(check).scheme
    try:
        if scheme in ("redis", "rediss", "unix"):
            import redis  # a local import keeps `exa --help` fast

            client = redis.Redis.from_url(check, socket_connect_timeout=timeout, socket_timeout=timeout)
            try:
                return bool(client.ping())
            finally:
                client.close()
        import httpx

        return httpx.get(check, timeout=timeout).status_code < 400
    except Exception:
        return False


def ensure_port_free(host: str, port: int, *, what: str, setting: str) -> None:
    """Raise ``PortInUse`` naming ``setting`` when something already listens on ``host:port``."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        # SO_REUSEADDR, as the servers themselves set it: a port in TIME_WAIT is free to them.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                raise
            raise PortInUse(
                f"port {port} on {host} ({what}) is already in use; stop what holds it or set {setting}"
            ) from exc


def pid_alive(pid: int) -> bool:
    """True when ``pid`` exists (a zombie counts until it is reaped)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def group_members(pgid: int) -> list[str]:
    """``pid command line`` of each process in group ``pgid`` (from /proc; empty where there is none)."""
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[2]) != pgid:  # after the command's closing parenthesis: state, ppid, pgrp
                continue
            argv = (stat.parent / "cmdline").read_bytes().replace(b"\0", b" ").decode("utf-8", "replace")
        except (OSError, IndexError, ValueError):
            continue
        members.append(f"{stat.parent.name} {argv.strip()[:160]}")
    return members


def kill_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def tail(path: Path, lines: int = 20) -> str:
    """The last ``lines`` lines of a text file; empty when it does not exist."""
    try:
        with path.open("rb") as handle:
            handle.seek(0, os.SEEK_END)
            handle.seek(max(0, handle.tell() - 16_384))
            data = handle.read()
    except OSError:
        return ""
    return "\n".join(data.decode("utf-8", "replace").splitlines()[-lines:])


class ManagedProcess:
    """A child process in its own process group, with a log file and a health check."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        *,
        log_path: Path,
        health: HealthCheck,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
        stop_signal: signal.Signals = signal.SIGTERM,
        prepare: Callable[[], None] | None = None,
        stop_grace: float = 10.0,
        logs: LogSettings | None = None,
    ) -> None:
        self.name = name
        self.argv = list(argv)
        self.log_path = log_path
        self.health = health
        self.env = dict(env or {})
        self.cwd = cwd
        self.stop_signal = stop_signal
        self._prepare = prepare
        self.stop_grace = stop_grace
        self.logs = logs or LogSettings()
        self._popen: subprocess.Popen[bytes] | None = None
        self._pump: LogPump | None = None
        self.started_at = 0.0
        """UNIX time of the last ``start``."""
        self.ended_leftovers = False
        """The last ``stop`` found processes of the group left after its main process, and ended them."""

    @property
    def pid(self) -> int | None:
        return self._popen.pid if self._popen else None

    @property
    def pgid(self) -> int | None:
        # start_new_session makes the child the leader of a group whose id is its pid.
        return self.pid

    @property
    def returncode(self) -> int | None:
        return self._popen.poll() if self._popen else None

    def alive(self) -> bool:
        return self._popen is not None and self._popen.poll() is None

    def start(self) -> None:
        """Launch the process; a second call while it runs is a no-op."""
        if self.alive():
            return
        if self._prepare is not None:
            self._prepare()
        self.started_at = time.time()
        try:
            self._popen = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                env={**os.environ, **self.env},
                cwd=self.cwd,
                start_new_session=True,
            )
        except OSError as exc:
            raise ServiceStartFailed(f"{self.name}: cannot run {self.argv[0]}: {exc}") from exc
        assert self._popen.stdout is not None  # stdout=PIPE
        self._pump = LogPump(
            self._popen.stdout, self.log_path, max_bytes=self.logs.max_bytes, backups=self.logs.backups
        )
        self._pump.start()

    def check_ready(self) -> bool:
        """One readiness poll. Raises ``ServiceStartFailed`` (with the log tail) when the process has exited."""
        if not self.alive():
            if self._pump is not None:
                self._pump.join(timeout=2.0)  # its last words are still in the pipe
            raise ServiceStartFailed(
                f"{self.name} exited with code {self.returncode} while starting (log: {self.log_path})",
                log_tail=self.log_tail(),
            )
        # Alive again after a good answer: a port taken by a stranger must not pass for us.
        return probe(self.health) and self.alive()

    def wait_ready(self, timeout: float, interval: float = 0.2) -> None:
        """Block until the health check answers; ``ServiceStartFailed`` on exit or after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while not self.check_ready():
            if time.monotonic() >= deadline:
                raise ServiceStartFailed(
                    f"{self.name} was not ready after {timeout:.0f} s (log: {self.log_path})",
                    log_tail=self.log_tail(),
                )
            time.sleep(interval)

    def stop(self, grace: float | None = None) -> int | None:
        """Stop the main process (``stop_signal``, up to ``grace`` seconds, default ``stop_grace``), then what is
        left of its group (SIGTERM, ``LEFTOVER_GRACE_S``, SIGKILL). Returns the exit code, None when it was never
        started."""
        if self._popen is None:
            return None
        grace = self.stop_grace if grace is None else grace
        popen, pgid = self._popen, self._popen.pid
        self.ended_leftovers = False
        if popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                popen.send_signal(self.stop_signal)
            with contextlib.suppress(subprocess.TimeoutExpired):
                popen.wait(grace)
        if popen.poll() is not None:
            # Children that exit when their parent does (a multiprocessing fork server or resource tracker,
            # on their pipe's end of file) get a moment to go on their own.
            settle = time.monotonic() + LEFTOVER_SETTLE_S
            while group_alive(pgid) and time.monotonic() < settle:
                time.sleep(0.05)
        if group_alive(pgid):
            self.ended_leftovers = True
            main = "still running" if popen.poll() is None else f"exited {popen.returncode}"
            log.warning(
                "%s: ending what is left of its process group %d (main process %s): %s",
                self.name, pgid, main, "; ".join(group_members(pgid)) or "members unknown",
            )  # fmt: skip
            # The main process is gone or past its grace: end its group (a killed main's children, or all of it).
            kill_group(pgid, signal.SIGTERM)
            deadline = time.monotonic() + LEFTOVER_GRACE_S
            while group_alive(pgid) and time.monotonic() < deadline:
                popen.poll()  # reap our child so its group can empty
                time.sleep(0.05)
            if group_alive(pgid):
                kill_group(pgid, signal.SIGKILL)
        code = popen.wait()
        if self._pump is not None:
            self._pump.join(timeout=5.0)  # the group is gone, so the pipe's end of file is near
        return code

    def log_tail(self, lines: int = 20) -> str:
        return tail(self.log_path, lines)
