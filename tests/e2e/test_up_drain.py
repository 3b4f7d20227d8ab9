"""`exa down` under load: every request serving took before its drain began is answered 200.

The platform runs as `exa up --detach` (demo models seeded; Prefect and the served flows left out), one start
per rate on one state folder. The load is open-loop Poisson arrivals at the rate asked from
``bench/openloop.py`` in a process of its own (raw keep-alive connections: the client costs ~0.03 ms of CPU a
request, where an httpx client's ~2.5 ms bounded the rate it reached, bench/RESULTS.md), which records for
each request the ``time.monotonic()`` it went on the wire and its answer came. Beside it the test asks
``/readyz`` on a connection of its own, and two lanes send streams of ``STREAM_INSTANCES`` predictions back
to back (tens of milliseconds each): where the load's requests are answered within a few milliseconds (at
100 req/s), they are what is certainly in flight when the drain begins. `exa down` starts ``DOWN_AFTER_S``
after the first request; the load stops once a new connection is refused (serving closed its listener) or
after ``LOAD_S``.

The cut-off is the later of when `exa down` was started and when the last ``/readyz`` answered 200 went on the
wire: the drain had not begun then. Asserted: every request on the wire before the cut-off was answered 200 or,
answered after serving logged its drain's start, refused as draining (503 ``DRAINING``: a stream sent just
before the last ready poll has its large body read first, so the drain may have begun when serving checks it;
a request not taken, not one lost); none lost, reset or another 5xx; one was answered 200 after the drain began,
so a request really was in flight across it; of the load's arrivals before `exa down`, few (``UNSENT_AT_MOST``)
went unsent for want of a free connection and none met a refused one; every later request was answered 200,
refused as draining or met a closed listener; none was cut off in a predict worker (``worker_lost``); serving
stopped its predict workers itself (no "drain grace over" in serving.log; up.log says exit 0 and nothing left
of its group to end); `exa down` exits 0 and leaves no ``up.json``. The rate reached is printed (``-s``), never
asserted. ``E2E_DRAIN_RPS`` (default 100) and ``E2E_DRAIN_HIGH_RPS`` (default 800) set the two rates asked.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import sys
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from tests.e2e.test_up_down import Exa, platform_env

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

RATES = (int(os.environ.get("E2E_DRAIN_RPS", "100")), int(os.environ.get("E2E_DRAIN_HIGH_RPS", "800")))
LOAD_S = 40.0
DOWN_AFTER_S = 3.0
POLL_S = 0.01
MAX_CONNECTIONS = 400
"""The load's connections at most, under serving's cap (``serving.max_connections``, 1,000): on a machine too
busy to keep up, an arrival past them is not sent (counted as such), rather than refused by serving as too many
connections before the drain began, which is serving's overload and not its drain."""
UNSENT_AT_MOST = 0.05
"""The share of the load's arrivals before `exa down` that may go unsent (every connection busy): past it the
load did not reach serving, and the run shows little of the drain."""
DRAINING = "serving is shutting down"
"""What serving's 503 says of a request it refused because its drain had begun."""
STREAM_INSTANCES = 200
STREAM_LANES = 2
OPENLOOP = Path(__file__).resolve().parents[2] / "bench" / "openloop.py"
REFUSED = (
    *("ConnectionRefusedError", "IncompleteReadError", "ConnectionResetError", "BrokenPipeError"),  # the load's
    *("ConnectError", "RemoteProtocolError", "ReadError", "WriteError"),  # the streams' (httpx)
    "no connection free",  # never sent: every one of the load's connections was busy
)
"""What a request on the wire after the drain began may meet once serving closes its listener and its idle
keep-alive connections: refused, or a keep-alive connection closed (or reset) under a request the server had
not read yet (the HTTP keep-alive close race)."""


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return platform_env(tmp_path_factory.mktemp("drain") / "state", EXAMLOPS_PREDICT__WORKERS="2")


@pytest.fixture
def exa(env: dict[str, str]) -> Iterator[Exa]:
    runner = Exa(env)
    up = runner("up", "--detach", "--skip", "prefect", "--skip", "flows", "--timeout", "240", timeout=400)
    assert up.returncode == 0, up.stdout + up.stderr
    yield runner
    runner("down", timeout=120)


@dataclass
class Sent:
    """One request of the load, as ``bench/openloop.py`` wrote it (times from ``time.monotonic()``)."""

    wire_at: float
    answered_at: float
    status: int
    error: str
    detail: str

    @classmethod
    def read(cls, raw: dict[str, Any]) -> Sent:
        def t(v: float | None) -> float:
            return math.nan if v is None else v

        return cls(t(raw["wire_at"]), t(raw["answered_at"]), raw["status"], raw["error"], raw["detail"])

    def before(self, at: float) -> bool:
        return self.wire_at < at  # False for one never on the wire (nan)

    @property
    def outcome(self) -> int | str:
        return self.status or self.error or "no answer"

    def refused_as_draining(self, drain_began: float) -> bool:
        """A 503 that says the drain had begun, answered after serving logged that it began."""
        return self.status == 503 and DRAINING in self.detail and self.answered_at > drain_began


@dataclass
class Readiness:
    last_ready: float = float("-inf")
    """When the last poll answered 200 went on the wire: the drain had not begun then."""
    drain_seen: float | None = None
    """When a poll first met 503 or a refused connection came back: the drain had begun then."""


def _on_wire(record: list[float]) -> Any:
    async def trace(event: str, _info: dict[str, Any]) -> None:
        if event == "http11.send_request_headers.started":
            record.append(time.monotonic())

    return trace


async def _poll(url: str, readiness: Readiness, until: asyncio.Event) -> None:
    """Ask ``/readyz`` every ``POLL_S`` until ``until`` is set; note the last 200 and the first refusal."""
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:
        while not until.is_set():
            wire: list[float] = []
            try:
                reply = await client.get("/readyz", extensions={"trace": _on_wire(wire)})
                ready = reply.status_code == 200
            except httpx.TransportError:
                ready = False
            if ready and wire:
                readiness.last_ready = wire[0]
            elif not ready and readiness.drain_seen is None:
                readiness.drain_seen = time.monotonic()
            await asyncio.sleep(POLL_S)


async def _streams(url: str, token: str, body: bytes, sent: list[Sent], until: asyncio.Event) -> None:
    """One lane of back-to-back streams of ``STREAM_INSTANCES`` predictions until ``until`` is set, each noted in
    ``sent`` (a stream cut short is an error): a request that takes tens of milliseconds, so that one is in
    flight when the drain begins even where the load's own requests are answered within a few."""
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    async with httpx.AsyncClient(base_url=url, timeout=90, headers=headers) as client:
        while not until.is_set():
            wire: list[float] = []
            record = Sent(math.nan, math.nan, 0, "", "")
            try:
                reply = await client.post("/v1/models/JPCP/stream", content=body, extensions={"trace": _on_wire(wire)})
                record.answered_at, record.status = time.monotonic(), reply.status_code
                end = json.loads(reply.text.splitlines()[-1]) if reply.status_code == 200 else {}
                if reply.status_code == 200 and end.get("answered") != STREAM_INSTANCES:
                    record.status, record.error = 0, "stream cut short"
                if record.status != 200:
                    record.detail = reply.text[-300:]
            except httpx.TransportError as exc:
                record.error = type(exc).__name__
            record.wire_at = wire[0] if wire else math.nan
            sent.append(record)
            if record.error == "ConnectError":
                return  # serving closed its listener
            if record.status != 200:
                await asyncio.sleep(POLL_S)


@dataclass
class Run:
    sent: list[Sent]
    readiness: Readiness
    down_at: float
    down_code: int
    down_output: str
    load_count: int
    """``sent`` holds the load's requests first, then the streams."""

    @property
    def cutoff(self) -> float:
        return max(self.down_at, self.readiness.last_ready)


async def _load(exa: Exa, url: str, token: str, rps: int, folder: Path) -> Run:
    """The load in its own process, `exa down` ``DOWN_AFTER_S`` after its first request, the poller beside."""
    rng = np.random.default_rng(0)
    payload = {"model": "JPCP", "embedding": [float(v) for v in rng.normal(0, 0.05, 384)], "node_count": 12}
    body, out = folder / f"body-{rps}.json", folder / f"sent-{rps}.json"
    body.write_text(json.dumps(payload))
    readiness, stop_polling = Readiness(), asyncio.Event()
    poller = asyncio.create_task(_poll(url, readiness, stop_polling))
    instances = [{"embedding": [round(float(v), 3) for v in rng.normal(0, 0.05, 384)], "node_count": 12}]
    stream = json.dumps({"instances": instances * STREAM_INSTANCES, "budget_ms": 60_000}).encode()
    streamed: list[Sent] = []
    lanes = [asyncio.create_task(_streams(url, token, stream, streamed, stop_polling)) for _ in range(STREAM_LANES)]
    load = await asyncio.create_subprocess_exec(
        sys.executable, str(OPENLOOP), "--url", f"{url}/infer-pipeline/infer", "--rate", str(rps),
        "--seconds", str(LOAD_S), "--body", str(body), "--header", f"Authorization: Bearer {token}",
        "--max-connections", str(MAX_CONNECTIONS), "--stop-when-refused", "--out", str(out),
        stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert load.stdout is not None
    assert (await asyncio.wait_for(load.stdout.readline(), 60)).strip() == b"started"
    await asyncio.sleep(DOWN_AFTER_S)
    down_at = time.monotonic()
    down = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "examlops.cli.main", "down", env=exa.env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    output, _ = await asyncio.wait_for(down.communicate(), 180)
    assert await asyncio.wait_for(load.wait(), LOAD_S + 120) == 0
    stop_polling.set()
    await asyncio.gather(poller, *lanes)
    sent = [Sent.read(raw) for raw in json.loads(out.read_text())] + streamed
    return Run(
        sent, readiness, down_at, down.returncode or 0, output.decode("utf-8", "replace"), len(sent) - len(streamed)
    )


def _drain_began(serving_log: Path) -> float:
    """When serving logged that its drain began (its SIGTERM), as ``time.monotonic()`` (to the millisecond)."""
    line = next(line for line in reversed(serving_log.read_text().splitlines()) if ": draining (" in line)
    wall = datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()  # logging's asctime, local time
    return wall - (time.time() - time.monotonic())


def _arrived_before(load: list[Sent], at: float) -> list[Sent]:
    """The load's arrivals up to the last one on the wire before ``at`` (``load`` is in arrival order), sent or
    not."""
    last = max((i for i, s in enumerate(load) if s.before(at)), default=-1)
    return load[: last + 1]


def _figures(rps: int, run: Run, load_average: tuple[float, float, float]) -> str:
    """The rate reached before `exa down` (requests on the wire a second) and what became of each request."""
    load = run.sent[: run.load_count]
    early = sorted(s.wire_at for s in load if s.before(run.down_at))
    reached = (len(early) - 1) / (early[-1] - early[0]) if len(early) > 1 else 0.0
    before = Counter(s.outcome for s in run.sent if s.before(run.cutoff))
    after = Counter(s.outcome for s in run.sent if not s.before(run.cutoff))
    took = sorted(s.answered_at - s.wire_at for s in load if s.before(run.down_at) and s.status == 200)
    p50 = took[len(took) // 2] * 1000 if took else math.nan
    seen = run.readiness.drain_seen
    arrived = _arrived_before(load, run.down_at)
    unsent = sum(1 for s in arrived if math.isnan(s.wire_at))
    return (
        f"{rps} req/s asked, {reached:.0f} req/s reached on the wire before `exa down` (answer p50 {p50:.0f} ms; "
        f"{unsent} of {len(arrived)} arrivals before it not sent); "
        f"on the wire before the cut-off: {dict(before)}; after: {dict(after)}; drain seen "
        f"{(seen or math.nan) - run.cutoff:.3f} s after the cut-off (`exa down` started "
        f"{run.readiness.last_ready - run.down_at:+.3f} s before the last ready poll); streams beside it: "
        f"{dict(Counter(s.outcome for s in run.sent[run.load_count :]))}; load average {load_average}"
    )


@pytest.mark.parametrize("rps", RATES)
def test_down_under_load_answers_every_request_sent_before_the_drain_with_200(
    exa: Exa, rps: int, tmp_path: Path
) -> None:
    home = Path(exa.env["EXAMLOPS_HOME"])
    serving = json.loads((home / "run" / "up.json").read_text())["services"]
    url = next(s["url"] for s in serving if s["name"] == "serving")
    token = (home / "admin.token").read_text().strip()
    run = asyncio.run(_load(exa, url, token, rps, tmp_path))
    print(_figures(rps, run, os.getloadavg()))
    shown = f"exa down said:\n{run.down_output}"
    assert run.down_code == 0, shown
    assert run.readiness.drain_seen is not None, shown  # the poller saw the drain begin (503, or refused)
    before = [s for s in run.sent if s.before(run.cutoff)]
    assert before, shown  # the load ran before the drain
    began = _drain_began(home / "logs" / "serving.log")
    failed = [(s.outcome, s.detail) for s in before if s.status != 200 and not s.refused_as_draining(began)]
    assert failed == [], shown  # none lost, reset or 5xx: answered 200, or not taken as the drain had begun
    # On the wire before serving logged its drain's start, answered 200 after it: in flight across the drain.
    # (Not only those before the cut-off: a busy poller may see the drain begin a good while after its last 200.)
    across = [s for s in run.sent if s.before(began) and s.status == 200 and s.answered_at > began]
    assert across, shown
    arrived = _arrived_before(run.sent[: run.load_count], run.down_at)
    unsent = Counter(s.error for s in arrived if math.isnan(s.wire_at))
    assert set(unsent) <= {"no connection free"}, (unsent, shown)  # no connection refused before `exa down`
    assert unsent.total() <= UNSENT_AT_MOST * len(arrived), (unsent, len(arrived), shown)  # the load reached serving
    after = [s for s in run.sent if not s.before(run.cutoff)]
    unexpected = Counter(s.outcome for s in after if s.status not in (200, 503) and s.error not in REFUSED)
    assert not unexpected, (unexpected, shown)
    assert not [s for s in run.sent if "worker_lost" in s.detail], shown
    assert not (home / "run" / "up.json").exists(), shown
    logs = home / "logs"
    assert "drain grace over" not in (logs / "serving.log").read_text(), shown
    stopped = [line for line in (logs / "up.log").read_text().splitlines() if line.startswith("stopped serving ")]
    assert len(stopped) == 1 and "(exit 0," in stopped[0], (stopped, shown)
    assert "ended what was left of its process group" not in stopped[0], (stopped, shown)
