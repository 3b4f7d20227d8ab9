"""`exa up` keeps the platform serving: SIGKILL of Redis, the MLflow server, the bridge and serving each end with
the platform serving again by itself. `exa down` under load is ``test_up_drain.py``.

One platform for the module (`exa up --detach`, demo models seeded; Prefect and the served flows left out, as
no kill here concerns them), driven as an operator does: signals to the pids `exa status` shows, `exa` for
everything else. Bus jobs with known ids (``BusLoad``: the fault suite's ``History`` and its checker) run
through every kill, so that exactly-once is shown across them: each job the bus took answered once and
recorded once (one ``inference.served`` event), none lost.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from examlops.bootstrap.bridge import bus_client
from examlops.core.settings import Settings
from examlops.platform.process import group_alive
from tests.e2e.test_up_down import Exa, platform_env
from tests.faults.checker import check, served_event_job_ids
from tests.faults.cluster import ADDRESS, PAYLOAD
from tests.faults.history import History

# The module's platform starts in the first test's setup: on a loaded 2-core machine that alone can take minutes.
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

KILLED = ("redis", "mlflow", "bridge", "serving")
BUS_RATE = 10.0
"""Bus jobs a second while the services are killed (the fault suite holds 50 with faster restarts)."""


@pytest.fixture(scope="module")
def exa(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Exa]:
    home = tmp_path_factory.mktemp("resilience") / "state"
    env = platform_env(home, EXAMLOPS_PREDICT__WORKERS="2", EXAMLOPS_UP__RESTART_BACKOFF_S="0.5")
    runner = Exa(env)
    up = runner("up", "--detach", "--skip", "prefect", "--skip", "flows", "--timeout", "240", timeout=400)
    assert up.returncode == 0, up.stdout + up.stderr
    yield runner
    runner("down", timeout=120)


def _services(exa: Exa) -> dict[str, dict[str, Any]]:
    doc = json.loads((Path(exa.env["EXAMLOPS_HOME"]) / "run" / "up.json").read_text())
    return {s["name"]: s for s in doc["services"]}


def _wait_running_again(exa: Exa, name: str, old_pid: int, timeout_s: float = 180) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            service = _services(exa)[name]
        except (OSError, ValueError):
            service = {}
        if service.get("state") == "running" and service.get("pid") != old_pid:
            return service
        time.sleep(0.5)
    log = Path(exa.env["EXAMLOPS_HOME"]) / "logs" / "up.log"
    raise AssertionError(f"{name} not running again after {timeout_s} s:\n{log.read_text()[-3000:]}")


def _up_log(exa: Exa, *, raw: bool = False) -> str:
    """up.log; unless ``raw``, with its whitespace runs made single spaces: the supervisor's console wraps a
    line past ``COLUMNS`` (a long state-folder path is enough), which would split a phrase searched for."""
    text = (Path(exa.env["EXAMLOPS_HOME"]) / "logs" / "up.log").read_text()
    return text if raw else " ".join(text.split())


def _serves(exa: Exa) -> str:
    """One prediction over HTTP and one job over the bus; the job's id."""
    by_http = exa("serve", "infer-check", "--json")
    assert by_http.returncode == 0, by_http.stdout + by_http.stderr
    by_bus = exa("bus", "send", "JPCP", "--random", "--node-count", "7", "--json", timeout=60)
    assert by_bus.returncode == 0, by_bus.stdout + by_bus.stderr
    job_id: str = json.loads(by_bus.stdout)["job_id"]
    return job_id


def _served_events(redis_url: str, jobs: list[str]) -> dict[str, int]:
    """How many ``inference.served`` events the audit stream holds per job, once each job has one (recording
    is asynchronous) or after 60 s. The whole stream, not a tail: ``BusLoad``'s jobs push the early ones out
    of any window (no flow archives the stream here)."""
    deadline = time.monotonic() + 60
    with redis.Redis.from_url(redis_url, decode_responses=True, socket_timeout=30) as client:
        while True:
            served = served_event_job_ids(client)
            counts = {job: served[job] for job in jobs}
            if all(counts.values()) or time.monotonic() > deadline:
                return counts
            time.sleep(1)


class BusLoad:
    """Bus jobs ``kill-<n>`` at ``BUS_RATE`` a second (at most 8 at a time, 30 s each) from a thread of its own,
    each recorded in ``history``, until ``stop()``; the fault suite's checker then judges them."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.history = History()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)
        self._thread.start()

    async def _run(self) -> None:
        gate, tasks = asyncio.Semaphore(8), []
        async with bus_client(self.settings) as client:

            async def one(job_id: str) -> None:
                async with gate:
                    await self.history.bus_request(client, ADDRESS, PAYLOAD, 30.0, job_id)

            start, n = time.monotonic(), 0
            while not self._stop.is_set():
                tasks.append(asyncio.create_task(one(f"kill-{n}")))
                n += 1
                await asyncio.sleep(max(0.0, start + n / BUS_RATE - time.monotonic()))
            await asyncio.gather(*tasks)

    def stop(self) -> History:
        self._stop.set()
        self._thread.join(120)
        assert not self._thread.is_alive()
        return self.history


def test_sigkill_of_each_service_ends_with_the_platform_serving_again(
    exa: Exa, monkeypatch: pytest.MonkeyPatch
) -> None:
    for key, value in exa.env.items():
        if key.startswith("EXAMLOPS_"):
            monkeypatch.setenv(key, value)
    settings = Settings()
    load = BusLoad(settings)
    jobs = [_serves(exa)]
    for name in KILLED:
        pid = _services(exa)[name]["pid"]
        os.kill(pid, signal.SIGKILL)
        back = _wait_running_again(exa, name, pid)
        assert back["restarts"] >= 1 and back["last_exit"] == -signal.SIGKILL
        assert not group_alive(pid), f"{name}'s killed process group {pid} is still there"
        jobs.append(_serves(exa))
    history = load.stop()
    figures = check(history, settings.redis_url, settings)
    print("bus load across the kills:", figures.summary())  # figures, with -s
    assert figures.violations() == []
    assert figures.invoked == figures.ok + figures.failed + figures.unknown and figures.ok > 0
    # each job recorded once, across the kills
    assert _served_events(settings.redis_url, jobs) == dict.fromkeys(jobs, 1)
    status = exa("status", "--json")
    doc = json.loads(status.stdout)
    assert status.returncode == 0, status.stdout
    assert {s["name"]: s["restarts"] for s in doc["services"]} == dict.fromkeys(KILLED, 1)
    verified = exa("audit", "verify", "--json")
    assert verified.returncode == 0, verified.stdout + verified.stderr
    up_log = _up_log(exa)
    for name in KILLED:
        assert f"{name} exited unexpectedly with code -9" in up_log and f"{name} is back" in up_log
    print(*(line for line in _up_log(exa, raw=True).splitlines() if " is back " in line), sep="\n")  # with -s


def test_a_ui_service_failing_at_its_first_start_is_retried_then_left_failed_while_serving_runs(exa: Exa) -> None:
    """Run last: the module's platform is started again, seeded already, with an MLflow UI that cannot start."""
    assert exa("down", timeout=120).returncode == 0
    # Only the MLflow server runs uvicorn's command line, which reads UVICORN_*: its server exits at once.
    broken = Exa({**exa.env, "UVICORN_LOOP": "no-such-loop", "EXAMLOPS_UP__RESTART_LIMIT": "2"})
    up = broken("up", "--detach", "--skip", "prefect", "--skip", "flows", "--timeout", "240", timeout=400)
    assert up.returncode == 0, up.stdout + up.stderr
    deadline = time.monotonic() + 120
    while (service := _services(exa)["mlflow"])["state"] != "failed" and time.monotonic() < deadline:
        time.sleep(0.5)
    assert service["state"] == "failed", service
    services = _services(exa)
    assert [services[name]["state"] for name in ("redis", "serving", "bridge")] == ["running"] * 3
    _serves(exa)  # over HTTP and over the bus
    up_log = _up_log(exa)
    assert "mlflow exited with code" in up_log and "restarting in" in up_log
    assert "left stopped: MLflow UI is not needed for serving" in up_log
