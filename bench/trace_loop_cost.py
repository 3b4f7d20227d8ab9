"""What authentication and tracing cost serving's event-loop thread, per call, with no server or socket (issue 16).

``auth_trace_cost.py`` measures the issue's figure (throughput at c=64, on against off), but its client,
servers, predict workers and trace writer share two cores, and its pairs spread by ±5-15 %. This bench
takes the machine's noise out of one part of it: two of serving's real apps (``bootstrap.serving_app``
on the demo state folder, as `exa serve start` builds it), one with authentication and tracing on and
one with both off, run in this process on one event loop, each called through ASGI directly (no HTTP, no
socket) at ``--concurrency`` calls at a time with JPCP bodies on ``/v1/models/JPCP/predict``. Their
predict runtime answers at once (zeros), so what is measured is the loop thread's own work: routing,
authentication, admission, batching, tracing. The on-app's trace writer runs as in serving (its thread
here, its child process apart).

The two alternate over ``--rounds`` rounds of ``--calls`` calls (the order flips every round), and after
each of the on-app's rounds the bench waits ``--settle`` seconds off the clock, so that the writer's last
batch of a round is not written during the next one (the apps share this thread). Printed:
the median CPU time of this thread per call of each (``time.thread_time``: the writer thread and child
are not counted, only what they cost this thread), and the median and quartiles of the paired
differences (on minus off, round by round), the steadiest figure here; then the traces the on-app wrote
and dropped (a run that drops traces understates the cost). The per-app figures include this bench's own
ASGI calls; the difference does not. The bench clears the shell's ``EXAMLOPS_*`` variables first.

``--on auth`` or ``--on tracing`` turns only one on in the on-app; ``--on-setting EXAMLOPS_NAME=VALUE``
(repeatable) gives the on-app a setting, e.g. the trace writer's batch (``EXAMLOPS_TRACING__BATCH=256
EXAMLOPS_TRACING__LINGER_S=0.2``: the defaults before 2048 and 1 s) to compare two settings run after
run.

    .venv/bin/python bench/trace_loop_cost.py [--rounds 30] [--calls 1500] [--concurrency 64] [--settle 1.5] \
        [--on auth tracing] [--on-setting EXAMLOPS_NAME=VALUE] [--home PATH]

Figures only: nothing here asserts anything.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import statistics
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import orjson
from starlette.types import ASGIApp, Message

sys.path.insert(0, str(Path(__file__).resolve().parent))
from demo import add_on_setting, admin_token, demo_state, on_settings
from demo import bodies as demo_bodies

FEATURES = ("auth", "tracing")
PATH = "/v1/models/JPCP/predict"
_LIFESPANS: set[asyncio.Task[None]] = set()
"""The apps' lifespan tasks, kept running (and referenced) until the process ends."""


class InstantRuntime:
    """A predict runtime that answers every row with 0.0 at once (after one loop turn, as a pipe would)."""

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        return None

    async def load(self, key: str, location: str) -> int | None:
        return None

    async def unload(self, key: str) -> None:
        return None

    async def predict(self, key: str, rows: Any) -> npt.NDArray[np.float64]:
        await asyncio.sleep(0)
        return np.zeros(len(rows))


@contextmanager
def environment(values: dict[str, str]) -> Iterator[None]:
    saved = dict(os.environ)
    os.environ.update(values)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def app_env(home: Path, on: bool, features: set[str], settings: dict[str, str]) -> dict[str, str]:
    """An app's ``EXAMLOPS_*`` variables: ``settings`` (the on-app's only), then the state folder, node and
    features, which they cannot override."""
    env = dict(settings) if on else {}
    env |= {"EXAMLOPS_HOME": str(home), "EXAMLOPS_TRACING__NODE": "loop-on" if on else "loop-off"}
    if not (on and "auth" in features):
        env |= {"EXAMLOPS_ENVIRONMENT": "development", "EXAMLOPS_AUTH__ENABLED": "false"}
    if not (on and "tracing" in features):
        env["EXAMLOPS_TRACING__ENABLED"] = "false"
    return env


def build(env: dict[str, str]) -> ASGIApp:
    from examlops.bootstrap.serving import serving_app
    from examlops.core.settings import Settings

    with environment(env):
        app: ASGIApp = serving_app(Settings(), InstantRuntime())
    return app


async def start(app: ASGIApp) -> None:
    """The app's lifespan started and kept running (``_LIFESPANS``): the pipeline is up once this returns."""
    inbox: asyncio.Queue[Message] = asyncio.Queue()
    outbox: asyncio.Queue[Message] = asyncio.Queue()
    scope = {"type": "lifespan", "asgi": {"version": "3.0"}, "state": {}}
    _LIFESPANS.add(asyncio.ensure_future(app(scope, inbox.get, outbox.put)))
    await inbox.put({"type": "lifespan.startup"})
    message = await outbox.get()
    if message["type"] != "lifespan.startup.complete":
        raise SystemExit(f"the app did not start: {message}")


async def ready(app: ASGIApp, timeout_s: float = 120.0) -> None:
    """Wait until the app's ``/readyz`` answers 200 (its hot set loads after start-up)."""
    until = time.monotonic() + timeout_s
    while await call(app, b"", None, method="GET", path="/readyz") != 200:
        if time.monotonic() > until:
            raise SystemExit("the app was not ready in time")
        await asyncio.sleep(0.2)


async def call(app: ASGIApp, body: bytes, token: bytes | None, *, method: str = "POST", path: str = PATH) -> int:
    return (await exchange(app, body, token, method=method, path=path))[0]


async def exchange(
    app: ASGIApp, body: bytes, token: bytes | None, *, method: str = "POST", path: str = PATH
) -> tuple[int, bytes]:
    """One ASGI call of ``app``: its status and body."""
    headers = [(b"host", b"bench"), (b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
    if token is not None:
        headers.append((b"authorization", b"Bearer " + token))
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": headers,
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 2),
        "state": {},
    }
    given = False
    status = 0
    reply: list[bytes] = []

    async def receive() -> Message:
        nonlocal given
        if not given:
            given = True
            return {"type": "http.request", "body": body, "more_body": False}
        await asyncio.Event().wait()  # no disconnect: the call ends when the app answers
        raise AssertionError("unreachable")

    async def send(message: Message) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]
        elif message["type"] == "http.response.body":
            reply.append(message.get("body", b""))

    await app(scope, receive, send)
    return status, b"".join(reply)


async def load(app: ASGIApp, bodies: list[bytes], token: bytes | None, calls: int, concurrency: int) -> float:
    """CPU µs of this thread per call over ``calls`` calls, ``concurrency`` at a time; every one must be a 200."""
    next_call = 0
    failed: dict[int, int] = {}

    async def caller() -> None:
        nonlocal next_call
        while next_call < calls:
            index = next_call
            next_call += 1
            status = await call(app, bodies[index % len(bodies)], token)
            if status != 200:
                failed[status] = failed.get(status, 0) + 1

    began = time.thread_time()
    await asyncio.gather(*(caller() for _ in range(concurrency)))
    spent = time.thread_time() - began
    if failed:
        raise SystemExit(f"calls that were not answered 200: {failed}")
    return spent / calls * 1e6


def quartiles(values: list[float]) -> tuple[float, float, float]:
    ordered = sorted(values)
    n = len(ordered)
    return ordered[n // 4], statistics.median(ordered), ordered[(3 * n) // 4]


async def trace_counts(app: ASGIApp) -> str:
    """The app's traces written and dropped, from its ``/metrics``."""
    _, text = await exchange(app, b"", None, method="GET", path="/metrics")
    found = dict(re.findall(r"^examlops_traces_(written|dropped)_total ([0-9.e+]+)$", text.decode(), re.MULTILINE))
    return f"{float(found.get('written', 'nan')):.0f} traces written, {float(found.get('dropped', 'nan')):.0f} dropped"


async def run(args: argparse.Namespace, features: set[str], settings: dict[str, str]) -> None:
    for name in [name for name in os.environ if name.startswith("EXAMLOPS_")]:
        del os.environ[name]  # the apps' settings are the bench's, not the shell's
    home = args.home.resolve()
    demo_settings, catalog = demo_state(home)
    token = admin_token(demo_settings).encode() if "auth" in features else None
    bodies = [orjson.dumps(b) for b in demo_bodies(catalog.get("JPCP").embedding_dim, 500, seed=5)]
    off = build(app_env(home, False, features, settings))
    on_env = app_env(home, True, features, settings)
    os.environ.update(on_env)  # the on-app's trace writer child reads its settings from the environment
    on = build(on_env)
    for app in (on, off):
        await start(app)
        await ready(app)
    for app, app_token in ((on, token), (off, None)):
        await load(app, bodies, app_token, 2000, args.concurrency)  # warm: caches, the writer, the child
    per_call: dict[bool, list[float]] = {True: [], False: []}
    for round_ in range(args.rounds):
        for is_on in (True, False) if round_ % 2 == 0 else (False, True):
            app, app_token = (on, token) if is_on else (off, None)
            per_call[is_on].append(await load(app, bodies, app_token, args.calls, args.concurrency))
            if is_on:  # off the clock: the round's last traces are written before the next round
                await asyncio.sleep(args.settle)
    for is_on in (True, False):
        print(
            f"{'on ' if is_on else 'off'}: {statistics.median(per_call[is_on]):6.1f} µs CPU per call (median of "
            f"{args.rounds} rounds; range {min(per_call[is_on]):.1f}-{max(per_call[is_on]):.1f})"
        )
    low, mid, high = quartiles([a - b for a, b in zip(per_call[True], per_call[False], strict=True)])
    print(f"on - off, paired by round: median {mid:+.1f} µs, quartiles {low:+.1f} / {high:+.1f} µs")
    if "tracing" in features:
        print(f"on-app: {await trace_counts(on)}", flush=True)
    # The apps' lifespans are left running: closing them waits on the trace writer and the pools, none of
    # it measured any more; the process ends here and its children with it.
    os._exit(0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--calls", type=int, default=1500, help="Calls per app per round.")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument(
        "--settle", type=float, default=1.5, help="Seconds after each on-round, off the clock, for its traces."
    )
    parser.add_argument("--on", nargs="+", choices=FEATURES, default=list(FEATURES), help="What the on-app has on.")
    add_on_setting(parser, "on-app")
    parser.add_argument("--home", type=Path, default=Path(".examlops/bench-trace-loop"))
    args = parser.parse_args()
    settings = on_settings(parser, args)
    if args.rounds < 1 or args.calls < 1:
        parser.error("--rounds and --calls must be at least 1")
    print(f"on: {' and '.join(sorted(args.on))}{''.join(f', {k}={v}' for k, v in settings.items())}; off: neither")
    asyncio.run(run(args, set(args.on), settings))


if __name__ == "__main__":  # the trace writer's child process imports this module again
    main()
