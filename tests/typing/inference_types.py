"""Checked by mypy (strict), never run: the spec's two type parameters reach every call with no annotation.

``typing.assert_type`` fails the type check when the inferred type differs, so a port that lost its
types (``Any``) or the wrong ones breaks ``mypy`` here rather than in a handler.
"""

from __future__ import annotations

from typing import assert_type

from pydantic import BaseModel

from examlops.inference import Inference, InferencePort, InferenceSpec, Wiring
from examlops.inference.adapters.mock import MockInferenceRegistry


class FraudFeatures(BaseModel):
    amount: float
    country: str
    velocity_24h: int


class FraudScore(BaseModel):
    risk: float


FRAUD_SCORER = InferenceSpec(name="fraud_scorer", input=FraudFeatures, output=FraudScore)

registry = MockInferenceRegistry().on(FRAUD_SCORER, lambda instances: [{"risk": i.amount / 1000} for i in instances])


async def handler(inference: Inference) -> float:
    port = inference.model(FRAUD_SCORER)
    assert_type(port, InferencePort[FraudFeatures, FraudScore])

    score = await port.predict(FraudFeatures(amount=120.0, country="NL", velocity_24h=3))
    assert_type(score, FraudScore)

    scores = await port.predict_many([FraudFeatures(amount=1.0, country="NL", velocity_24h=0)])
    assert_type(scores, list[FraudScore])

    async for chunk in port.predict_stream([{"amount": 5.0, "country": "FR", "velocity_24h": 1}], chunk_size=8):
        assert_type(chunk, list[FraudScore])

    return score.risk + sum(s.risk for s in scores)


async def main() -> float:
    async with Inference.from_wiring(Wiring({"fraud_scorer": registry})) as inference:
        return await handler(inference)
