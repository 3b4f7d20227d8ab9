"""`exa up` keeps the platform serving: SIGKILL of Redis, the MLflow server, the bridge and serving each end with
the platform serving again by itself; `exa down` under load answers every request accepted before it with 200.

One platform for the module (`exa up --detach`, demo models seeded; Prefect and the served flows left out, as
no kill here concerns them), driven as an operator does: signals to the pids `exa status` shows, `exa` for
everything else. The load is bounded: ``E2E_DRAIN_RPS`` requests per second (100 by default; 800 is the
issue's high variant, for a machine that can produce it) until serving has closed its listener or `exa down`
has finished, at most ``LOAD_S`` seconds.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from tests.e2e.test_up_down import Exa, _free_port

# The module's platform starts in the first test's setup: on a loaded 2-core machine that alone can take minutes.
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

KILLED = ("redis", "mlflow", "bridge", "serving")
LOAD_S = 30.0
DOWN_AFTER_S = 1.5
REFUSED = ("ConnectError", "RemoteProtocolError", "ReadError")
"""What a request sent after `exa down` may meet once serving has drained and closes its listener and its
idle keep-alive connections: refused, or a keep-alive connection closed (or reset) under a request the
server had not read yet: the HTTP keep-alive close race, seen about once per run here. A client cannot tell
that last case from a request cut off after it was read, so this test asserts the strict property on the
requests sent before `exa down` (all 200) and on every answer (never ``worker_lost``)."""


@pytest.fixture(scope="module")
def exa(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Exa]:
    home = tmp_path_factory.mktemp("resilience") / "state"
    env = {k: v for k, v in os.environ.items() if not k.startswith("EXAMLOPS_")}
    env.update(
        EXAMLOPS_HOME=str(home),
        EXAMLOPS_REDIS__PORT=str(_free_port()),
        EXAMLOPS_MLFLOW__UI_PORT=str(_free_port()),
        EXAMLOPS_PREFECT__PORT=str(_free_port()),
        EXAMLOPS_SERVING__PORT=str(_free_port()),
        EXAMLOPS_PREDICT__WORKERS="2",
        EXAMLOPS_UP__RESTART_BACKOFF_S="0.5",
        COLUMNS="200",
        # The services start in the state folder: this keeps them on the code under test, not on whatever
        # checkout the environment's editable install points at.
        PYTHONPATH=os.pathsep.join(
            filter(None, [str(Path(__file__).resolve().parents[2]), os.environ.get("PYTHONPATH")])
        ),
    )
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


def _serves(exa: Exa) -> str:
    """One prediction over HTTP and one job over the bus; the job's id."""
    by_http = exa("serve", "infer-check", "--json")
    assert by_http.returncode == 0, by_http.stdout + by_http.stderr
    by_bus = exa("bus", "send", "JPCP", "--random", "--node-count", "7", "--json", timeout=60)
    assert by_bus.returncode == 0, by_bus.stdout + by_bus.stderr
    job_id: str = json.loads(by_bus.stdout)["job_id"]
    return job_id


def _served_events(exa: Exa, jobs: list[str]) -> dict[str, int]:
    """How many ``inference.served`` events the trail holds per job, once each job has one (recording is
    asynchronous) or after 60 s."""
    deadline = time.monotonic() + 60
    while True:
        tail = exa("audit", "tail", "-n", "1000", "--json")
        assert tail.returncode == 0, tail.stderr
        served = [e["data"]["job_id"] for e in json.loads(tail.stdout) if e["type"] == "inference.served"]
        counts = {job: served.count(job) for job in jobs}
        if all(counts.values()) or time.monotonic() > deadline:
            return counts
        time.sleep(1)


def test_sigkill_of_each_service_ends_with_the_platform_serving_again(exa: Exa) -> None:
    jobs = [_serves(exa)]
    for name in KILLED:
        pid = _services(exa)[name]["pid"]
        os.kill(pid, signal.SIGKILL)
        back = _wait_running_again(exa, name, pid)
        assert back["restarts"] >= 1 and back["last_exit"] == -signal.SIGKILL
        jobs.append(_serves(exa))
    assert _served_events(exa, jobs) == dict.fromkeys(jobs, 1)  # each job recorded once, across the kills
    status = exa("status", "--json")
    doc = json.loads(status.stdout)
    assert status.returncode == 0, status.stdout
    assert {s["name"]: s["restarts"] for s in doc["services"]} == dict.fromkeys(KILLED, 1)
    verified = exa("audit", "verify", "--json")
    assert verified.returncode == 0, verified.stdout + verified.stderr
    up_log = (Path(exa.env["EXAMLOPS_HOME"]) / "logs" / "up.log").read_text()
    for name in KILLED:
        assert f"{name} exited unexpectedly with code -9" in up_log and f"{name} is back" in up_log
    print(*(line for line in up_log.splitlines() if " is back " in line), sep="\n")  # figures, with -s


@dataclass
class Sent:
    at: float
    status: int | None = None
    body: str = ""
    error: str = ""


async def _load(exa: Exa, url: str, token: str, rps: int) -> tuple[list[Sent], float, int]:
    """``rps`` predictions a second, `exa down` after ``DOWN_AFTER_S``, until serving's listener is closed or
    `exa down` is done (at most ``LOAD_S`` seconds); every request, when it was sent, the exit code of `down`."""
    rng = np.random.default_rng(0)
    payload = {"model": "JPCP", "embedding": [float(v) for v in rng.normal(0, 0.05, 384)], "node_count": 12}
    sent: list[Sent] = []
    limits = httpx.Limits(max_connections=200, max_keepalive_connections=200)

    async def one(client: httpx.AsyncClient, record: Sent) -> None:
        try:
            reply = await client.post("/infer-pipeline/infer", json=payload)
            record.status, record.body = reply.status_code, reply.text[:300]
        except httpx.TransportError as exc:
            record.error = type(exc).__name__

    async with httpx.AsyncClient(
        base_url=url, timeout=60, limits=limits, headers={"Authorization": f"Bearer {token}"}
    ) as client:
        tasks, down, down_at = [], None, float("inf")
        t0 = time.monotonic()
        for i in range(int(rps * LOAD_S)):
            await asyncio.sleep(max(0.0, t0 + i / rps - time.monotonic()))
            if down is None and time.monotonic() - t0 >= DOWN_AFTER_S:
                down_at = time.monotonic()
                down = await asyncio.create_subprocess_exec(
                    sys.executable, "-m", "examlops.cli.main", "down", env=exa.env,
                    stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
                )  # fmt: skip
            if down is not None and (down.returncode is not None or any(s.error == "ConnectError" for s in sent)):
                break  # serving has drained and closed its listener, or everything is stopped
            record = Sent(time.monotonic())
            sent.append(record)
            tasks.append(asyncio.create_task(one(client, record)))
        await asyncio.gather(*tasks)
        assert down is not None
        code = await asyncio.wait_for(down.wait(), 120)
    return sent, down_at, code


def test_down_under_load_answers_every_request_accepted_before_it_with_200(exa: Exa) -> None:
    rps = int(os.environ.get("E2E_DRAIN_RPS", "100"))
    serving = _services(exa)["serving"]
    token = (Path(exa.env["EXAMLOPS_HOME"]) / "admin.token").read_text().strip()
    sent, down_at, code = asyncio.run(_load(exa, serving["url"], token, rps))
    assert code == 0
    before = [s for s in sent if s.at < down_at]
    assert before  # the load ran before `exa down` (at the rate this machine's client can send, up to rps)
    assert [s for s in before if s.status != 200] == []
    # After `exa down`: answered (200), refused as draining (503, retryable), or the listener closed; never a
    # request cut off in a worker (503 worker_lost) or left without an answer.
    after = [s for s in sent if s.at >= down_at]
    unexpected = Counter(s.status or s.error for s in after if s.status not in (200, 503) and s.error not in REFUSED)
    assert not unexpected, unexpected
    assert not [s for s in sent if "worker_lost" in s.body]
    assert not (Path(exa.env["EXAMLOPS_HOME"]) / "run" / "up.json").exists()
    outcomes = Counter(s.status or s.error for s in after)
    sending = (sent[-1].at - sent[0].at) if len(sent) > 1 else 0.0
    achieved = len(sent) / sending if sending else 0.0
    print(f"{rps} req/s asked, {achieved:.0f} sent: {len(before)} before exa down, all 200; after: {dict(outcomes)}")
