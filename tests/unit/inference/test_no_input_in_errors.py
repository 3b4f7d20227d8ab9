"""Input values never reach an error's message or the capture unless the spec captures inputs verbatim."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

import pytest

from examlops.inference import Capture, InferenceError, InferencePort
from examlops.inference.adapters.local import LocalInferenceAdapter, LocalTarget
from examlops.inference.adapters.mock import MockInferenceRegistry
from examlops.inference.ports import Call, Capabilities, Row
from tests.unit.inference.fakes import FRAUD, features

SECRET = "123-45-6789"


class Leaky:
    """A model whose exceptions carry the input values, as real models' do."""

    def predict_batch(self, instances: Sequence[Mapping[str, Any]]) -> list[dict[str, float]]:
        return [{"risk": float(instance["country"])} for instance in instances]  # ValueError: ... '<country>'


class KeyErrorModel:
    def predict_batch(self, instances: Sequence[Mapping[str, Any]]) -> list[dict[str, float]]:
        raise KeyError(instances[0]["country"])


class RaisingAdapter:
    """An adapter whose own (non-taxonomy) exception carries the input."""

    backend = "raising"
    capabilities = Capabilities(native_batching=True)

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        return None

    async def predict_batch(self, route: str, rows: Sequence[Row], call: Call) -> Sequence[Row]:
        raise KeyError(rows[0]["country"])

    def stream_batches(self, route: str, rows: Sequence[Row], call: Call) -> AsyncIterator[Sequence[Row]]:
        raise NotImplementedError


def _mock() -> MockInferenceRegistry:
    def fn(instances: list[Any]) -> list[dict[str, float]]:
        raise KeyError(instances[0].country)

    return MockInferenceRegistry().on(FRAUD, fn)


async def _fail(adapter: Any) -> tuple[InferenceError, list[Capture]]:
    captured: list[Capture] = []
    port = InferencePort(FRAUD, adapter, on_capture=captured.append)
    with pytest.raises(InferenceError) as raised:
        await port.predict(features(1.0, country=SECRET))
    return raised.value, captured


def _assert_clean(error: InferenceError, captured: list[Capture]) -> None:
    assert SECRET not in str(error) and SECRET not in error.message
    assert captured and all(SECRET not in repr(c) for c in captured)
    assert error.__cause__ is not None  # the original is kept for the operator, chained


@pytest.mark.parametrize("model", [Leaky, KeyErrorModel])
async def test_a_local_model_exception_names_its_type_only(model: type[Any]) -> None:
    adapter = LocalInferenceAdapter({"fraud_scorer": LocalTarget(model)})
    await adapter.start()
    try:
        error, captured = await _fail(adapter)
    finally:
        await adapter.close()
    _assert_clean(error, captured)
    assert type(error.__cause__).__name__ in error.message


async def test_a_mock_function_exception_names_its_type_only() -> None:
    error, captured = await _fail(_mock())
    _assert_clean(error, captured)
    assert "KeyError" in error.message


async def test_an_adapter_exception_names_its_type_only() -> None:
    error, captured = await _fail(RaisingAdapter())
    _assert_clean(error, captured)
    assert error.code == "inference_adapter_error" and "KeyError" in error.message
