"""Wiring from Python and from YAML, the adapter registry, and the composition's start and close."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from pydantic import BaseModel

from examlops.inference import (
    Inference,
    InferenceError,
    InferenceSpec,
    Kind,
    Wiring,
    register_adapter,
)
from examlops.inference import wiring as wiring_module
from examlops.inference.adapters.local import LocalTarget
from examlops.inference.adapters.mock import MockInferenceRegistry
from tests.unit.inference.fakes import FRAUD, FraudScore, features, scoring_registry
from tests.unit.inference.models import load_doubler, load_nothing


class Pavement(BaseModel):
    embedding: list[float]
    node_count: int


class Score(BaseModel):
    score: float


JPCP = InferenceSpec(name="jpcp", input=Pavement, output=Score)


async def test_one_handler_gets_the_same_answer_from_the_mock_and_a_local_model() -> None:
    async def handler(inference: Inference) -> list[FraudScore]:
        return await inference.model(FRAUD).predict_many([features(100.0), features(250.0)])

    async with Inference.from_wiring(Wiring({"fraud_scorer": scoring_registry()})) as mocked:
        from_mock = await handler(mocked)
    async with Inference.from_wiring(Wiring({"fraud_scorer": LocalTarget(load_doubler)})) as local:
        from_local = await handler(local)
    assert from_mock == from_local == [FraudScore(risk=0.1), FraudScore(risk=0.25)]


async def test_an_unknown_route_is_a_precondition() -> None:
    inference = Inference.from_wiring(Wiring({"fraud_scorer": scoring_registry()}))
    with pytest.raises(InferenceError) as caught:
        inference.model(JPCP)
    assert (caught.value.kind, caught.value.code, caught.value.route) == (
        Kind.PRECONDITION,
        "inference_route_unknown",
        "jpcp",
    )


def _skops_model(path: Path) -> None:
    import skops.io
    from sklearn.linear_model import LinearRegression

    x = np.array([[1.0, 0.0, 1.0], [0.0, 1.0, 2.0], [1.0, 1.0, 3.0], [2.0, 0.0, 1.0]])
    skops.io.dump(LinearRegression().fit(x, x @ np.array([1.0, 2.0, 0.5])), path)


async def test_yaml_wires_local_routes_from_a_skops_file_and_a_callable(tmp_path: Path) -> None:
    _skops_model(tmp_path / "jpcp.skops")
    wiring = tmp_path / "wiring.yaml"
    wiring.write_text(
        f"""
routes:
  jpcp:
    adapter: local
    loader: skops
    path: {tmp_path / "jpcp.skops"}
    output_field: score
  fraud_scorer:
    adapter: local
    loader: callable
    ref: tests.unit.inference.models:load_doubler
    serialize_calls: true
adapters:
  local: {{workers: 2}}
"""
    )
    async with Inference.from_wiring(wiring) as inference:
        score = await inference.model(JPCP).predict(Pavement(embedding=[2.0, 1.0], node_count=4))
        assert score.score == pytest.approx(2.0 + 2.0 + 2.0)
        assert await inference.model(FRAUD).predict(features(10.0)) == FraudScore(risk=0.01)


@pytest.mark.parametrize(
    ("text", "what"),
    [
        ("routes: {jpcp: {adapter: nowhere}}", "no adapter is registered as 'nowhere'"),
        ("routes: {jpcp: {adapter: local, loader: pickle, path: x}}", "jpcp"),
        ("routes: {jpcp: {adapter: local, loader: callable, ref: 'no.such.module:load'}}", "jpcp"),
        ("routs: {}", "not valid"),
    ],
)
def test_a_wiring_file_that_does_not_parse_is_refused(tmp_path: Path, text: str, what: str) -> None:
    (tmp_path / "w.yaml").write_text(text)
    with pytest.raises(InferenceError) as caught:
        Inference.from_wiring(tmp_path / "w.yaml")
    assert (caught.value.kind, caught.value.code) == (Kind.VALIDATION, "inference_wiring_invalid")
    assert what in str(caught.value)


async def test_a_start_that_fails_closes_the_adapters_already_started() -> None:
    class Tracked(MockInferenceRegistry):
        closed = 0

        async def close(self) -> None:
            Tracked.closed += 1

    inference = Inference.from_wiring(Wiring({"fraud_scorer": Tracked(), "jpcp": LocalTarget(load_nothing)}))
    with pytest.raises(InferenceError) as caught:
        await inference.start()
    assert caught.value.code == "inference_model_load_failed"
    assert Tracked.closed == 1


async def test_a_registered_adapter_gets_its_routes_and_shared_settings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[tuple[dict[str, Any], dict[str, Any]]] = []

    def factory(targets: Mapping[str, Any], settings: Mapping[str, Any]) -> MockInferenceRegistry:
        seen.append((dict(targets), dict(settings)))
        return scoring_registry()

    monkeypatch.setattr(wiring_module, "_FACTORIES", dict(wiring_module._FACTORIES))
    register_adapter("test-remote", factory)
    (tmp_path / "w.yaml").write_text(
        "routes: {fraud_scorer: {adapter: test-remote, url: 'http://x', emulate_streaming: true}}\n"
        "adapters: {test-remote: {token: t}}\n"
    )
    inference = Inference.from_wiring(tmp_path / "w.yaml")
    assert seen == [({"fraud_scorer": {"url": "http://x"}}, {"token": "t"})]
    chunks = [c async for c in inference.model(FRAUD).predict_stream([features(1.0)] * 3, chunk_size=2)]
    assert [len(c) for c in chunks] == [2, 1]


async def test_a_policy_wraps_each_adapter_once() -> None:
    wrapped: list[object] = []

    def policy(adapter: Any) -> Any:
        wrapped.append(adapter)
        return adapter

    registry = scoring_registry()
    Inference.from_wiring(Wiring({"fraud_scorer": registry, "other": registry}), policy=policy)
    assert wrapped == [registry]
