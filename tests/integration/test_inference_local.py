"""The local inference adapter with the MLflow loader answers as examlops serving does, for the same rows.

One real MLflow store seeded with the demo models; a real serving process on it; the same JPCP
Production version loaded in-process through ``examlops.inference`` (wired from a YAML file).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
from pydantic import BaseModel

from examlops.core.settings import Settings
from examlops.inference import Inference, InferenceError, InferenceSpec, Wiring
from examlops.inference.adapters.local import LocalTarget
from examlops.inference.loaders import mlflow_model
from examlops.registry.catalog import load_catalog
from examlops.registry.demo import seed_demo
from tests.integration.servers import ServingProcess

pytestmark = [
    pytest.mark.integration,
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::UserWarning"),
    pytest.mark.filterwarnings("ignore::FutureWarning"),
]


class Pavement(BaseModel):
    embedding: list[float]
    node_count: int


class Score(BaseModel):
    score: float


JPCP = InferenceSpec(name="jpcp", input=Pavement, output=Score)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Settings, ServingProcess]]:
    home = tmp_path_factory.mktemp("inference-local")
    settings = Settings(home=home)
    seed_demo(settings, load_catalog(settings.catalog_path))
    proc = ServingProcess(home, env={"EXAMLOPS_PREDICT__WORKERS": "1"})
    try:
        proc.wait_ready()
        yield settings, proc
    finally:
        assert proc.stop() == 0, proc.log_tail()


def rows(count: int = 6) -> list[Pavement]:
    rng = np.random.default_rng(7)
    return [
        Pavement(embedding=[float(v) for v in rng.normal(0, 0.05, 384)], node_count=int(rng.integers(1, 40)))
        for _ in range(count)
    ]


def served_prediction(proc: ServingProcess, row: Pavement) -> float:
    body = {"model": "JPCP", "alias": "Production", **row.model_dump()}
    reply = httpx.post(f"{proc.url}/infer-pipeline/infer", json=body, timeout=30, headers=proc.auth)
    assert reply.status_code == 200, reply.text
    assert reply.json()["version"] == "1"
    return float(reply.json()["prediction"])


async def test_the_local_adapter_with_the_mlflow_loader_predicts_as_serving_does(
    served: tuple[Settings, ServingProcess], tmp_path: Path
) -> None:
    settings, proc = served
    wiring = tmp_path / "wiring.yaml"
    wiring.write_text(
        "routes:\n"
        "  jpcp:\n"
        "    adapter: local\n"
        "    loader: mlflow\n"
        "    model_uri: models:/JPCP@production\n"
        f"    tracking_uri: '{settings.mlflow_tracking_uri}'\n"
        f"    cache_dir: '{tmp_path / 'cache'}'\n"
        "    output_field: score\n"
    )
    instances = rows()
    async with Inference.from_wiring(wiring) as inference:
        local = await inference.model(JPCP).predict_many(instances)
    expected = [served_prediction(proc, row) for row in instances]
    assert [s.score for s in local] == pytest.approx(expected, rel=1e-9, abs=1e-12)


async def test_a_missing_registered_model_fails_start_up_closed(served: tuple[Settings, ServingProcess]) -> None:
    settings, _ = served
    loader = mlflow_model("models:/NOPE@Production", tracking_uri=settings.mlflow_tracking_uri)
    inference = Inference.from_wiring(Wiring({"jpcp": LocalTarget(loader)}))
    with pytest.raises(InferenceError) as caught:
        await inference.start()
    assert caught.value.code == "inference_model_load_failed"
