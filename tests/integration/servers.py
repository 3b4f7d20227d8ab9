"""Helpers that run the real serving process for integration tests: a real uvicorn on a free port."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

import httpx

from tests.ports import AWAY_FROM_THE_PLATFORM, free_port


def upgraded(env: Mapping[str, str]) -> str:
    """What `exa up` does first: bring the SQL schema of a child's environment to the newest revision, and
    create the admin identity (its token in the state folder) if there is none. The admin token."""
    from examlops.bootstrap import upgrade_database
    from examlops.bootstrap.identity import platform_token, provision_admin
    from examlops.core.settings import Settings

    home, url = Path(env["EXAMLOPS_HOME"]), env.get("EXAMLOPS_DATABASE_URL")
    settings = Settings(home=home) if url is None else Settings(home=home, database_url=url)
    upgrade_database(settings)
    provision_admin(settings)
    token = platform_token(settings)
    assert token is not None, f"no admin token in {settings.admin_token_path}"
    return token


def known_token(settings: object, token: str, name: str = "tests") -> None:
    """Make ``token`` an admin identity's key in the SQL of ``settings`` (an ``examlops`` ``Settings`` whose
    schema is current), as `exa identity add` would with a token of its own; nothing when it is there."""
    from datetime import UTC, datetime

    from examlops.bootstrap.sql import sql_engine
    from examlops.core.settings import Settings
    from examlops.identity import Identity, Role
    from examlops.identity.model import IdentityKey
    from examlops.identity.sql import SqlIdentityStore
    from examlops.identity.tokens import derive_bus_key, hash_secret, parse_token

    assert isinstance(settings, Settings)
    key_id, secret = parse_token(token)
    engine = sql_engine(settings)
    try:
        store = SqlIdentityStore(engine)
        if store.key(key_id) is None:
            now = datetime.now(UTC)
            key = IdentityKey(key_id, name, hash_secret(secret), derive_bus_key(secret), now)
            store.add(Identity(name=name, role=Role.ADMIN, created=now), key)
    finally:
        engine.dispose()


def examlops_env(home: Path, **extra: str) -> dict[str, str]:
    """The environment of a child process: no EXAMLOPS_* from the shell, a private state folder, and the
    platform's default ports moved away (``tests.ports``) unless ``extra`` names them."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("EXAMLOPS_")}
    env |= AWAY_FROM_THE_PLATFORM
    env["EXAMLOPS_HOME"] = str(home)
    env.update(extra)
    return env


class ServingProcess:
    """`exa serve start` in a child process; `stop()` sends SIGTERM and waits."""

    def __init__(self, home: Path, env: Mapping[str, str] | None = None, port: int | None = None) -> None:
        self.home = home
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = home / f"serving-{self.port}.log"
        full_env = examlops_env(home, **dict(env or {}))
        self.token = upgraded(full_env)
        self.auth = {"Authorization": f"Bearer {self.token}"}
        """Headers that authenticate as the admin identity `exa up` would create."""
        self._log = self.log_path.open("wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "examlops.cli.main", "serve", "start", "--port", str(self.port)],
            env=full_env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def wait_ready(self, timeout_s: float = 90.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"serving exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                if httpx.get(f"{self.url}/readyz", timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        raise TimeoutError(f"serving not ready after {timeout_s} s:\n{self.log_tail()}")

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def close_log(self) -> None:
        """For a process that was killed rather than stopped: close its log file."""
        self._log.close()

    def stop(self, timeout_s: float = 30.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self._log.close()
        # The predict workers live in the same session; none may outlive serving.
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                os.killpg(self.proc.pid, 0)
            except ProcessLookupError:
                return self.proc.returncode
            time.sleep(0.1)
        os.killpg(self.proc.pid, signal.SIGKILL)
        raise AssertionError("serving left processes behind in its session")
