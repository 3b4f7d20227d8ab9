"""Specs and fakes at the inference port's Adapter protocol: they record what they were asked."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import replace

from pydantic import BaseModel

from examlops.inference import Call, Capabilities, InferenceSpec
from examlops.inference.adapters.mock import MockInferenceRegistry
from examlops.inference.ports import Row


class FraudFeatures(BaseModel):
    amount: float
    country: str
    velocity_24h: int


class FraudScore(BaseModel):
    risk: float


FRAUD = InferenceSpec(name="fraud_scorer", input=FraudFeatures, output=FraudScore)
FRAUD_VERBATIM = InferenceSpec(name="fraud_scorer", input=FraudFeatures, output=FraudScore, capture_inputs=True)


def features(amount: float, country: str = "NL", velocity: int = 1) -> FraudFeatures:
    return FraudFeatures(amount=amount, country=country, velocity_24h=velocity)


def scoring_registry(max_batch: int | None = None) -> MockInferenceRegistry:
    return MockInferenceRegistry(max_batch=max_batch).on(
        FRAUD, lambda instances: [{"risk": min(1.0, i.amount / 1000)} for i in instances]
    )


class RecordingAdapter:
    """Another adapter's capabilities over a mock; records each call's ``Call`` and every stream it closed."""

    def __init__(self, inner: MockInferenceRegistry, capabilities: Capabilities | None = None) -> None:
        self.inner = inner
        self.backend = "recording"
        self.capabilities = capabilities or replace(inner.capabilities, streaming=False)
        self.calls: list[Call] = []
        self.streams_closed = 0

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        return None

    async def predict_batch(self, route: str, rows: Sequence[Row], call: Call) -> Sequence[Row]:
        self.calls.append(call)
        return await self.inner.predict_batch(route, rows, call)

    async def stream_batches(self, route: str, rows: Sequence[Row], call: Call) -> AsyncIterator[Sequence[Row]]:
        self.calls.append(call)
        try:
            async for chunk in self.inner.stream_batches(route, rows, call):
                yield chunk
        finally:
            self.streams_closed += 1
