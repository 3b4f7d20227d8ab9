"""The platform under ``closed_loop.py``: `exa up` on a fresh state folder, plus more serving instances.

``Platform(home, env_overrides, instances=2)``:

- ``start()`` wipes ``home`` (only a folder this module made before, marked by ``MARKER``, or an empty one),
  picks free ports for Redis, MLflow, Prefect and every serving instance, runs `exa up` in the foreground in
  a session of its own (the first serving instance, the bridge, Prefect, `exa flows serve`, MLflow, Redis,
  the demo seed), waits until it reports ``ready``, then starts the other instances with `exa serve start`
  on the same state folder and waits for their ``/readyz``. ``EXAMLOPS_SERVING__INSTANCES`` names every
  instance in every process, so a promotion (`exa promote`, the loop's) reloads and confirms each.
- ``stop()`` stops everything it started, whatever state ``start()`` reached: SIGTERM to each extra
  instance and to `exa up` (which stops its services), SIGKILL after a grace, then `exa down` on the state
  folder for any service group left behind. Safe to call twice.

``SystemExit`` when `exa up` or an instance is not ready in time (its log is named).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx
from procs import answers, free_port, start, stop, wait_until

from examlops.core.settings import Settings
from examlops.platform.up_state import UpState

MARKER = ".bench-closed-loop"
"""A state folder holding this file was made by this bench and may be wiped."""
EXA = [sys.executable, "-m", "examlops.cli.main"]


class Platform:
    def __init__(self, home: Path, overrides: dict[str, str], *, instances: int = 2, timeout_s: float = 150) -> None:
        self.home = home
        self.timeout_s = timeout_s
        ports = {name: free_port() for name in ("redis", "mlflow", "prefect")}
        self.serving_ports = [free_port() for _ in range(instances)]
        self.urls = [f"http://127.0.0.1:{port}" for port in self.serving_ports]
        env = {k: v for k, v in os.environ.items() if not k.startswith(("EXAMLOPS_", "PREFECT_"))}
        env |= {
            "EXAMLOPS_HOME": str(home),
            "EXAMLOPS_REDIS__PORT": str(ports["redis"]),
            "EXAMLOPS_MLFLOW__UI_PORT": str(ports["mlflow"]),
            "EXAMLOPS_PREFECT__PORT": str(ports["prefect"]),
            "EXAMLOPS_SERVING__PORT": str(self.serving_ports[0]),
            "EXAMLOPS_SERVING__INSTANCES": json.dumps(self.urls),
            "COLUMNS": "160",
        }
        self.env = env | overrides
        self.up: subprocess.Popen[bytes] | None = None
        self.extra: list[subprocess.Popen[bytes]] = []

    @property
    def settings(self) -> Settings:
        """The settings every process of the platform reads (built from ``env``)."""
        saved = dict(os.environ)
        try:
            os.environ.clear()
            os.environ.update(self.env)
            return Settings()
        finally:
            os.environ.clear()
            os.environ.update(saved)

    def exa(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """`exa ARGS` on the platform's state folder; its output is returned, never printed."""
        return subprocess.run([*EXA, *args], env=self.env, capture_output=True, text=True, timeout=timeout, check=False)

    def start(self) -> float:
        """Start everything (module docstring); the seconds it took."""
        began = time.monotonic()
        self._fresh_home()
        self.up = start([*EXA, "up", "--timeout", str(self.timeout_s)], self.env, self.home / "bench-up.log")
        run_dir, log = self.settings.run_dir, self.home / "bench-up.log"
        # The other instances start with the first one (once the demo seed is done): start-up is mostly
        # each instance loading its hot set, and they load side by side.
        wait_until(lambda: _up_state(run_dir, self.up, "serving") != "pending", f"exa up's seed (see {log})",
                   timeout=self.timeout_s, proc=self.up)  # fmt: skip
        for i, port in enumerate(self.serving_ports[1:], start=2):
            out = self.home / f"bench-serving-{i}.log"
            self.extra.append(start([*EXA, "serve", "start", "--port", str(port)], self.env, out))
        wait_until(lambda: _up_state(run_dir, self.up) == "ready", f"exa up (see {log})",
                   timeout=self.timeout_s, proc=self.up)  # fmt: skip
        for url, proc in zip(self.urls[1:], self.extra, strict=True):
            wait_until(answers(f"{url}/readyz"), f"serving at {url}", timeout=self.timeout_s, proc=proc)
        return time.monotonic() - began

    def stop(self) -> None:
        """Stop what ``start`` started (module docstring)."""
        for proc in [*self.extra, *([self.up] if self.up is not None else [])]:
            with contextlib.suppress(ProcessLookupError):  # it ended between the check and the signal
                stop(proc)
        self.extra, self.up = [], None
        if (self.settings.run_dir / "up.json").exists():
            self.exa("down", "--timeout", "30", timeout=90)

    def _fresh_home(self) -> None:
        if self.home.exists() and any(self.home.iterdir()):
            if not (self.home / MARKER).exists():
                raise SystemExit(f"{self.home} is not empty and was not made by this bench: give another --home")
            shutil.rmtree(self.home)
        self.home.mkdir(parents=True, exist_ok=True)
        (self.home / MARKER).write_text("made by bench/closed_loop.py; wiped at its next run\n")


def _up_state(run_dir: Path, proc: subprocess.Popen[bytes] | None, service: str = "") -> str:
    """The state `exa up` (``proc``) reports for itself, or for ``service``: "pending" before it says."""
    state = UpState.read(run_dir)
    if state is None or proc is None or state.supervisor_pid != proc.pid:
        return "pending"
    if not service:
        return state.state
    return next((record.state for record in state.services if record.name == service), "pending")


def instance_versions(urls: list[str], headers: dict[str, str], model: str) -> dict[str, dict[str, str | None]]:
    """Per instance, alias -> version of ``model`` in its hot set (``GET /v1/models``); {} for one that did
    not answer."""
    seen: dict[str, dict[str, str | None]] = {}
    for url in urls:
        try:
            entries = httpx.get(f"{url}/v1/models", headers=headers, timeout=2).json()
        except (httpx.HTTPError, ValueError):
            seen[url] = {}
            continue
        seen[url] = {e["alias"]: e["version"] for e in entries if e["model"] == model}
    return seen
