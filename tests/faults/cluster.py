"""The processes of one fault scenario, on free ports in one temporary folder, and the bounded load it drives.

``Cluster(home)`` starts a redis-server of its own (so a scenario may kill it)
and gives the ``Settings`` a client, a bridge and the checker share. Bridges
(`exa bridge start`, each with its recording child) and the serving stand-in
(``standin.py``) are child processes in sessions of their own, so a scenario
can SIGKILL, SIGTERM, SIGSTOP and SIGCONT them in user space; ``close()``
SIGKILLs whatever is left (and SIGCONTs a stopped one first), so nothing
outlives the scenario.

``drive`` is the load: ``jobs`` bus requests, ``concurrency`` at a time, each
recorded in the ``History``; it ends when every request is closed, bounded by
the client's timeout per request.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from pydantic import SecretStr

from examlops.bootstrap import upgrade_database
from examlops.bootstrap.bridge import bus_client
from examlops.bus.client import BusClient
from examlops.core.settings import HttpSettings, RecordingSettings, RedisSettings, ServingSettings, Settings
from examlops.platform.redis_server import EmbeddedRedis
from examlops.registry.catalog import load_catalog
from tests.faults.history import History, Outcome
from tests.integration.servers import examlops_env, known_token
from tests.ports import free_port

CATALOG = load_catalog(Settings().catalog_path)
ADDRESS = str(CATALOG.get("JPCP").seanerbus_uuid)
PAYLOAD = {"embedding": [0.01] * 384, "node_count": 12}
FAST_HTTP = HttpSettings(connect_timeout_s=1.0, read_timeout_s=2.0)
"""A bridge reclaims a dead bridge's jobs after 1 + 2 + 2 = 5 s idle instead of 17 s."""
RECLAIM_RECORDS_S = 5.0
"""A recorder claims a dead recorder's records after this long (60 s by default)."""
TOKEN = f"exa_{secrets.token_hex(8)}_{secrets.token_urlsafe(32)}"
REPO = Path(__file__).resolve().parents[2]


class Child:
    """One child process in a session of its own, logging to a file."""

    def __init__(self, name: str, argv: list[str], env: Mapping[str, str], log: Path) -> None:
        self.name, self.argv, self.env, self.log = name, argv, dict(env), log
        self.proc = self._spawn()

    def _spawn(self) -> subprocess.Popen[bytes]:
        with self.log.open("ab") as out:
            return subprocess.Popen(
                self.argv, env=self.env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, cwd=REPO
            )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def signal(self, sig: signal.Signals) -> None:
        """``sig`` to the child's whole session (a bridge's recording child too)."""
        if self.alive():
            os.killpg(self.proc.pid, sig)

    def kill(self) -> None:
        self.signal(signal.SIGKILL)
        self.proc.wait(10)

    def restart(self) -> None:
        if self.alive():
            self.kill()
        self.proc = self._spawn()

    async def restart_listening(self, port: int) -> None:
        """Restart, and return once it listens on ``port`` again."""
        self.restart()
        await asyncio.to_thread(wait_port, port, self)

    def stop(self, timeout_s: float = 30.0) -> int:
        """SIGCONT (it may be stopped), SIGTERM, then SIGKILL after ``timeout_s``."""
        if self.alive():
            self.signal(signal.SIGCONT)
            self.signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.kill()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)  # whatever it left in its session
        return self.proc.returncode

    def logged(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_logged(self, text: str, timeout_s: float = 60.0, *, times: int = 1) -> None:
        """Until ``text`` is in the log ``times`` times (its log outlives restarts)."""
        deadline = time.monotonic() + timeout_s
        while self.logged().count(text) < times:
            if not self.alive():
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}:\n{self.logged()[-3000:]}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.name} never logged {text!r}:\n{self.logged()[-3000:]}")
            time.sleep(0.1)


class Cluster:
    def __init__(self, home: Path) -> None:
        self.home = home
        self.redis = EmbeddedRedis(home / "redis", free_port())
        self.redis.start()
        self.serving_port = free_port()
        self.settings = Settings(
            home=home,
            redis=RedisSettings(url=self.redis.url),
            serving=ServingSettings(port=self.serving_port),
            http=FAST_HTTP,
            recording=RecordingSettings(reclaim_idle_s=RECLAIM_RECORDS_S),
            token=SecretStr(TOKEN),
        )
        upgrade_database(self.settings)
        known_token(self.settings, TOKEN)
        self.children: list[Child] = []

    def serving(self, delay_s: float = 0.0, port: int | None = None, *, fail: bool = False) -> Child:
        """The serving stand-in on ``port`` (the settings' serving port by default), ready; with ``fail`` every
        prediction is a 500 ``inference_failed``."""
        port = port or self.serving_port
        argv = [sys.executable, "-m", "tests.faults.standin", str(port), str(delay_s), *(["fail"] if fail else [])]
        child = Child(f"serving:{port}", argv, examlops_env(self.home), self.home / f"serving-{port}.log")
        self.children.append(child)
        wait_port(port, child)
        return child

    def real_serving(self) -> Child:
        """`exa serve start` with the demo models (seeded into this cluster's MLflow first) on the serving port,
        ready; minutes of CPU on a busy machine, so only the long scenarios use it."""
        from examlops.registry.demo import seed_demo

        seed_demo(self.settings, CATALOG)
        env = examlops_env(
            self.home,
            EXAMLOPS_REDIS__URL=self.redis.url,
            EXAMLOPS_PREDICT__WORKERS="2",
            EXAMLOPS_HOTSET__RELOAD_POLL_S="0",
        )
        argv = [sys.executable, "-m", "examlops.cli.main", "serve", "start", "--port", str(self.serving_port)]
        child = Child(f"real-serving:{self.serving_port}", argv, env, self.home / "real-serving.log")
        self.children.append(child)
        wait_ready(f"http://127.0.0.1:{self.serving_port}", child)
        return child

    def bridges(
        self, n: int, *, concurrency: int = 16, redis_url: str | None = None, serving_port: int | None = None
    ) -> list[Child]:
        """``n`` bridges started together, each ready (see ``bridge``)."""
        started = [
            self.bridge(concurrency=concurrency, redis_url=redis_url, serving_port=serving_port, wait=False)
            for _ in range(n)
        ]
        for child in started:
            child.wait_logged(" ready:")
        return started

    def bridge(
        self,
        *,
        concurrency: int = 16,
        redis_url: str | None = None,
        serving_port: int | None = None,
        wait: bool = True,
        env: Mapping[str, str] | None = None,
    ) -> Child:
        """`exa bridge start` (with its recording child), ready unless not ``wait``; ``redis_url`` and
        ``serving_port``: another way to Redis and serving (a fault proxy); ``env``: more of its environment."""
        settings = {
            "EXAMLOPS_REDIS__URL": redis_url or self.redis.url,
            "EXAMLOPS_TOKEN": TOKEN,
            "EXAMLOPS_SERVING__PORT": str(serving_port or self.serving_port),
            "EXAMLOPS_HTTP__CONNECT_TIMEOUT_S": str(FAST_HTTP.connect_timeout_s),
            "EXAMLOPS_HTTP__READ_TIMEOUT_S": str(FAST_HTTP.read_timeout_s),
            "EXAMLOPS_RECORDING__RECLAIM_IDLE_S": str(RECLAIM_RECORDS_S),
        }
        env = examlops_env(self.home, **{**settings, **dict(env or {})})  # ``env`` may override these
        n = sum(1 for c in self.children if c.name.startswith("bridge"))
        code = "from examlops.cli.bus import bridge_app; bridge_app()"
        argv = [sys.executable, "-c", code, "start", "--concurrency", str(concurrency), "--model", "JPCP"]
        child = Child(f"bridge-{n}", argv, env, self.home / f"bridge-{n}.log")
        self.children.append(child)
        if wait:
            child.wait_logged(" ready:")
        return child

    def client(self, redis_url: str | None = None) -> BusClient:
        settings = self.settings
        if redis_url is not None:
            settings = settings.model_copy(update={"redis": RedisSettings(url=redis_url)})
        return bus_client(settings)

    def logs_holding(self, secret: str) -> list[Path]:
        """The log files under the cluster's folder that contain ``secret`` (a token must never be logged)."""
        return [path for path in sorted(self.home.rglob("*.log")) if secret in path.read_text(errors="replace")]

    def kill_redis(self) -> None:
        pid = self.redis.process.pid
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        self.redis.stop(0)  # reaps it

    def restart_redis(self) -> None:
        self.redis.start(timeout=30)

    def close(self) -> None:
        self.stop_children()
        self.redis.stop()

    def stop_children(self) -> None:
        """SIGTERM every child at once (each drains its jobs and records meanwhile), SIGKILL what stays."""
        for child in self.children:  # all asked at once: each drains its jobs and records meanwhile
            child.signal(signal.SIGCONT)
            child.signal(signal.SIGTERM)
        for child in self.children:
            child.stop(10)


def wait_port(port: int, child: Child, timeout_s: float = 30.0) -> None:
    import socket

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            if not child.alive() or time.monotonic() > deadline:
                raise RuntimeError(f"{child.name} did not listen on {port}:\n{child.logged()[-3000:]}") from None
            time.sleep(0.1)


def wait_ready(url: str, child: Child, timeout_s: float = 300.0) -> None:
    """Until ``url``/readyz answers 200 (serving loads its models first)."""
    import httpx

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        if not child.alive() or time.monotonic() > deadline:
            raise RuntimeError(f"{child.name} was not ready:\n{child.logged()[-3000:]}")
        time.sleep(0.25)


async def drive(
    history: History,
    client: BusClient,
    *,
    jobs: int,
    concurrency: int,
    rate_per_s: float = 50.0,
    timeout_s: float = 30.0,
    prefix: str = "job",
    on_progress: Callable[[int], None] | None = None,
    retries: int = 0,
) -> None:
    """``jobs`` requests, at most ``concurrency`` at a time, started at ``rate_per_s`` (so the load holds
    through a fault instead of racing through it with fast errors); ``on_progress(closed)`` after each.
    ``retries``: a request whose outcome is unknown is sent again with the same job id, up to this many
    times, each try its own operation in the history (what a client does that must not lose a job)."""
    gate = asyncio.Semaphore(concurrency)
    closed = 0
    start = time.monotonic()

    async def one(i: int) -> None:
        nonlocal closed
        await asyncio.sleep(max(0.0, start + i / rate_per_s - time.monotonic()))
        async with gate:
            for _ in range(retries + 1):
                op = await history.bus_request(client, ADDRESS, PAYLOAD, timeout_s, f"{prefix}-{i}")
                if op.outcome is not Outcome.UNKNOWN:
                    break
        closed += 1
        if on_progress is not None:
            on_progress(closed)

    await asyncio.gather(*(one(i) for i in range(jobs)))


async def busy(history: History, timeout_s: float = 60.0) -> None:
    """Until some operation is in flight: a fault injected then lands on work, not in an idle moment (a fast
    serving at a paced load is idle between jobs most of the time)."""
    await until(lambda: history.in_flight_at(history.clock()) > 0, timeout_s)


async def until(predicate: Callable[[], bool], timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError("the condition never held")
        await asyncio.sleep(0.05)
