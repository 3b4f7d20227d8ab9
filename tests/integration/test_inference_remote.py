"""The remote adapters against real servers: an examlops serving process (its task, model, stream and V2
routes) and a real `mlflow models serve` of the same registered demo model.

The same rows must give the same predictions through the examlops, kserve_v2 and mlflow adapters as through
serving's own model route (pinned to Production, which the demo registers as version 1, the version the
scoring server serves); the taxonomy is checked on what the real servers answer. The adapters are called at
their protocol (rows in, mappings out): the port above them is built apart.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from pydantic import BaseModel

from examlops.core.settings import Settings
from examlops.inference import Inference, InferencePort, InferenceSpec
from examlops.inference.adapters.examlops import ExamlopsAdapter, ExamlopsTarget, examlops_adapter, served_trace
from examlops.inference.adapters.kserve_v2 import EXAMLOPS_V2, KserveV2Adapter, V2Target, kserve_v2_adapter
from examlops.inference.adapters.mlflow import MlflowAdapter, MlflowTarget, mlflow_adapter
from examlops.inference.errors import InferenceError, Kind
from examlops.inference.ports import Adapter, Call
from examlops.registry.catalog import load_catalog
from examlops.registry.demo import seed_demo
from tests.integration.servers import ServingProcess, examlops_env
from tests.ports import free_port

pytestmark = [
    pytest.mark.integration,
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::UserWarning"),
    pytest.mark.filterwarnings("ignore::FutureWarning"),
]

TASK = "pavement.distress.jpcp"
ROWS = 6
BIN = Path(sys.executable).parent


class MlflowServe:
    """`mlflow models serve --env-manager local` of ``model_uri`` on a free port, in its own process group."""

    def __init__(self, home: Path, settings: Settings, model_uri: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = home / f"mlflow-serve-{self.port}.log"
        env = examlops_env(home, MLFLOW_TRACKING_URI=settings.mlflow_tracking_uri)
        env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"  # it runs `uvicorn` from PATH
        self._log = self.log_path.open("wb")
        argv = [str(BIN / "mlflow"), "models", "serve", "-m", model_uri, "-h", "127.0.0.1", "-p", str(self.port)]
        self.proc = subprocess.Popen(
            [*argv, "--env-manager", "local"],
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def wait_ready(self, timeout_s: float = 120.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"mlflow models serve exited:\n{self.log_path.read_text(errors='replace')[-3000:]}")
            try:
                if httpx.get(f"{self.url}/ping", timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.3)
        raise TimeoutError("mlflow models serve did not answer /ping")

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self._log.close()


@dataclass(frozen=True)
class Servers:
    serving: ServingProcess
    scoring: MlflowServe
    """Serving Production (JPCP version 1)."""
    faulty: MlflowServe
    """Serving the demo's Staging version, which fails on every demo row."""


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Servers]:
    home = tmp_path_factory.mktemp("inference-remote")
    settings = Settings(home=home)
    seed_demo(settings, load_catalog(settings.catalog_path))
    # Batches of 4: a stream of ROWS instances comes back in more than one chunk.
    serving = ServingProcess(home, env={"EXAMLOPS_PREDICT__WORKERS": "1", "EXAMLOPS_BATCH__MAX_SIZE": "4"})
    scoring = MlflowServe(home, settings, "models:/JPCP@Production")
    faulty = MlflowServe(home, settings, "models:/JPCP@Staging")
    try:
        serving.wait_ready()
        scoring.wait_ready()
        faulty.wait_ready()
        yield Servers(serving, scoring, faulty)
    finally:
        scoring.stop()
        faulty.stop()
        code = serving.stop()
        assert code == 0, serving.log_tail()


@pytest.fixture(scope="module")
def rows() -> list[dict[str, Any]]:
    rng = np.random.default_rng(7)
    return [
        {"embedding": rng.normal(0, 0.05, 384).tolist(), "node_count": int(count)}
        for count in rng.integers(1, 200, ROWS)
    ]


def model_route(serving: ServingProcess, rows: list[dict[str, Any]]) -> list[float]:
    """Serving's own answer: the model route, one call per row, pinned to Production."""
    out = []
    for row in rows:
        reply = httpx.post(
            f"{serving.url}/v1/models/JPCP/predict",
            json={**row, "alias": "Production"},
            headers=serving.auth,
            timeout=30,
        )
        assert reply.status_code == 200, reply.text
        out.append(reply.json()["prediction"])
    return out


@pytest.fixture
async def adapters(servers: Servers) -> AsyncIterator[dict[str, Adapter]]:
    serving, scoring = servers.serving, servers.scoring
    # Built as a wiring file would have them: the factories, each route's mapping and the shared settings.
    ours = {"url": serving.url, "token": serving.token}
    built: dict[str, Adapter] = {
        "examlops-task": examlops_adapter({"score": {"task": TASK}}, ours),
        "examlops-model": examlops_adapter({"score": {"model": "JPCP", "alias": "Production"}}, ours),
        "kserve_v2": kserve_v2_adapter(
            {"score": {"model": "JPCP", "inputs": "examlops", "parameters": {"alias": "Production"}}}, ours
        ),
        "examlops-version": examlops_adapter({"score": {"model": "JPCP", "version": 1}}, ours),
        "kserve_v2-version": kserve_v2_adapter({"score": {"model": "JPCP", "version": 1, "inputs": "examlops"}}, ours),
        "mlflow": mlflow_adapter({"score": {"url": scoring.url, "format": "tensor"}}, {}),
    }
    for adapter in built.values():
        await adapter.start()
    yield built
    for adapter in built.values():
        await adapter.close()


async def test_the_same_rows_give_the_same_predictions_through_every_adapter_as_through_serving(
    servers: Servers, adapters: dict[str, Adapter], rows: list[dict[str, Any]]
) -> None:
    expected = [{"prediction": p} for p in model_route(servers.serving, rows)]
    for name, adapter in adapters.items():
        call = Call(route="score", deadline=time.monotonic() + 30)
        assert list(await adapter.predict_batch("score", rows, call)) == expected, name  # one call for the batch
        one = [(await adapter.predict_batch("score", [row], call))[0] for row in rows]
        assert one == expected, name  # a call per row


async def test_the_examlops_adapter_streams_chunks_in_order_and_reports_servings_trace_id(
    servers: Servers, adapters: dict[str, Adapter], rows: list[dict[str, Any]]
) -> None:
    adapter = adapters["examlops-task"]
    assert isinstance(adapter, ExamlopsAdapter)
    chunks = [c async for c in adapter.stream_batches("score", rows, Call(route="score", trace_id="mine"))]
    assert [len(chunk) for chunk in chunks] == [4, ROWS - 4]
    assert [out for chunk in chunks for out in chunk] == [{"prediction": p} for p in model_route(servers.serving, rows)]
    await adapter.predict_batch("score", rows[:1], Call(route="score", trace_id="not-adopted"))
    trace = served_trace()
    assert trace and trace != "not-adopted"  # serving adopts a trace id from a relaying identity only


async def test_real_servers_refusals_map_to_the_taxonomy(servers: Servers, rows: list[dict[str, Any]]) -> None:
    serving, scoring = servers.serving, servers.scoring
    short = [{"embedding": [0.1, 0.2], "node_count": 3}]

    def ours(target: ExamlopsTarget, token: str = serving.token) -> Adapter:
        return ExamlopsAdapter(serving.url, {"score": target}, token=token)

    def v2(model: str) -> Adapter:
        return KserveV2Adapter(serving.url, {"score": V2Target(model=model, inputs=EXAMLOPS_V2)}, headers=serving.auth)

    def scorer(url: str) -> Adapter:
        return MlflowAdapter(url, {"score": MlflowTarget()})

    v2_staging = KserveV2Adapter(
        serving.url,
        {"score": V2Target(model="JPCP", inputs=EXAMLOPS_V2, parameters={"alias": "Staging"})},
        headers=serving.auth,
    )
    cases: list[tuple[Adapter, list[dict[str, Any]], Kind, str | None]] = [
        (ours(ExamlopsTarget(task="no.such.task")), rows[:1], Kind.PRECONDITION, "unknown_task"),
        (ours(ExamlopsTarget(task=TASK), token="ex_bad_token"), rows[:1], Kind.PRECONDITION, "unauthenticated"),
        (ours(ExamlopsTarget(task=TASK)), short, Kind.VALIDATION, "invalid_input"),
        (ours(ExamlopsTarget(model="JPCP")), short * 2, Kind.VALIDATION, "invalid_input"),  # the stream route
        (ours(ExamlopsTarget(model="NOPE")), rows[:1], Kind.PRECONDITION, "model_not_found"),
        (v2("NOPE"), rows[:1], Kind.PRECONDITION, "model_not_found"),
        (v2("JPCP"), short, Kind.VALIDATION, "invalid_input"),
        (scorer(scoring.url), short, Kind.VALIDATION, "mlflow_invalid_parameter_value"),
        (scorer(f"http://127.0.0.1:{free_port()}"), rows[:1], Kind.INFRASTRUCTURE, None),
        # The demo's Staging version raises on every demo row: a model failure however it is reached.
        (ours(ExamlopsTarget(model="JPCP", alias="Staging")), rows[:1], Kind.MODEL_FAILURE, "inference_failed"),
        (ours(ExamlopsTarget(model="JPCP", alias="Staging")), rows, Kind.MODEL_FAILURE, "inference_failed"),
        (v2_staging, rows, Kind.MODEL_FAILURE, "inference_failed"),
        (scorer(servers.faulty.url), rows, Kind.MODEL_FAILURE, "mlflow_bad_request"),
    ]
    for adapter, batch, kind, code in cases:
        await adapter.start()
        try:
            with pytest.raises(InferenceError) as caught:
                await adapter.predict_batch("score", batch, Call(route="score", deadline=time.monotonic() + 30))
        finally:
            await adapter.close()
        assert caught.value.kind is kind, (adapter.backend, caught.value)
        if code is not None:
            assert caught.value.code == code, (adapter.backend, caught.value)


# One handler, four wirings: the same handler code gets the same predictions from an in-process model and
# from each served one; only the wiring file changes.


class Pavement(BaseModel):
    embedding: list[float]
    node_count: int


class Distress(BaseModel):
    prediction: float


DISTRESS = InferenceSpec(name="distress", input=Pavement, output=Distress)


async def handler(port: InferencePort[Pavement, Distress], rows: Sequence[Pavement]) -> list[float]:
    """Application code: knows the spec and its types, nothing of where the model runs."""
    return [score.prediction for score in await port.predict_many(rows)]


def wiring_for(kind: str, running: Servers, cache: Path) -> str:
    serving = running.serving
    if kind == "local":
        settings = Settings(home=serving.home)
        return (
            "routes:\n  distress:\n    adapter: local\n    loader: mlflow\n    model_uri: models:/JPCP@Production\n"
            f"    tracking_uri: '{settings.mlflow_tracking_uri}'\n    cache_dir: '{cache}'\n"
            "    output_field: prediction\n"
        )
    if kind == "examlops":
        return (
            "routes:\n  distress: {adapter: examlops, task: pavement.distress.jpcp}\n"
            f"adapters:\n  examlops: {{url: '{serving.url}', token: '{serving.token}'}}\n"
        )
    if kind == "kserve_v2":
        return (
            "routes:\n  distress: {adapter: kserve_v2, model: JPCP, inputs: examlops,"
            " parameters: {alias: Production}}\n"
            f"adapters:\n  kserve_v2: {{url: '{serving.url}', token: '{serving.token}'}}\n"
        )
    return f"routes:\n  distress: {{adapter: mlflow, url: '{running.scoring.url}', format: tensor}}\n"


async def test_one_handler_gets_the_same_predictions_from_every_backend_by_wiring_alone(
    servers: Servers, tmp_path: Path
) -> None:
    rng = np.random.default_rng(11)
    rows = [
        Pavement(embedding=[float(v) for v in rng.normal(0, 0.05, 384)], node_count=int(rng.integers(1, 40)))
        for _ in range(5)
    ]
    answers: dict[str, list[float]] = {}
    for kind in ("local", "examlops", "kserve_v2", "mlflow"):
        path = tmp_path / f"{kind}.yaml"
        path.write_text(wiring_for(kind, servers, tmp_path / "cache"))
        async with Inference.from_wiring(path) as inference:
            answers[kind] = await handler(inference.model(DISTRESS), rows)
    for kind, predictions in answers.items():
        assert predictions == pytest.approx(answers["local"], rel=1e-9, abs=1e-12), kind
    assert len(set(answers["local"])) > 1  # the rows differ, and so do their predictions
