"""A stream over the real pipeline (fake runtime): a client that leaves stops the work queued for it."""

from __future__ import annotations

import asyncio
import json
import random
from pathlib import Path

from prometheus_client import CollectorRegistry
from starlette.types import Message

from examlops.api.app import create_app
from examlops.core.settings import BatchSettings, HotSetSettings, PredictSettings, Settings
from examlops.serving.pipeline import Pipeline
from tests.unit.serving.fakes import (
    DIM,
    FakeClock,
    InMemoryModelSource,
    InMemoryTrafficRules,
    RecordingRuntime,
    make_catalog,
)

INSTANCES = 400


async def test_a_disconnect_mid_stream_leaves_far_fewer_predictions_than_instances(tmp_path: Path) -> None:
    settings = Settings(
        home=tmp_path,
        batch=BatchSettings(max_size=8, max_wait_ms=5),
        hotset=HotSetSettings(reload_poll_s=0),
        predict=PredictSettings(workers=1),
    )
    source, runtime = InMemoryModelSource(), RecordingRuntime()
    source.add("JPCP", "1", "Production")
    pipeline = Pipeline(
        settings, make_catalog("JPCP"), source, InMemoryTrafficRules(), runtime, wall=FakeClock(), rng=random.Random(3)
    )
    await pipeline.start()
    app = create_app(settings, pipeline, CollectorRegistry(), identities=None)
    body = json.dumps({"instances": [{"embedding": [0.5] * DIM, "node_count": 3}] * INSTANCES}).encode()
    gone = asyncio.Event()
    sent: list[Message] = []
    asked = False

    async def receive() -> Message:
        nonlocal asked
        if not asked:
            asked = True
            return {"type": "http.request", "body": body, "more_body": False}
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        sent.append(message)
        if message["type"] == "http.response.body" and message.get("body"):
            gone.set()

    scope = {
        "type": "http",
        "method": "POST",
        "path": "/v1/models/JPCP/stream",
        "raw_path": b"/v1/models/JPCP/stream",
        "query_string": b"",
        "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
        "http_version": "1.1",
        "scheme": "http",
        "server": ("serving", 80),
        "client": ("test", 1),
        "root_path": "",
    }
    try:
        await app(scope, receive, send)
        assert sent[0]["status"] == 200
        for _ in range(50):  # let the batcher run whatever it still would
            await asyncio.sleep(0)
        await asyncio.sleep(0.05)
        predicted = sum(rows for _, rows in runtime.predicts)
        assert 8 <= predicted <= 4 * 8  # the first chunk and at most what was already in a batch
    finally:
        await pipeline.close()
