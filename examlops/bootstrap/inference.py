"""Where examlops calls models itself through the inference port: the adapters those calls use.

- ``serving_inference(settings, route, target, url=None)``: the CLI's client of serving (`exa predict`,
  `exa serve infer-check`): the examlops adapter at ``url`` (default: the local serving) presenting the
  platform token (``identity.platform_token``), ``target`` wired to ``route``. Not started: the caller
  enters it (``async with``), which opens its one HTTP client.
- ``holdout_scorer(settings)``: what the retrain flow compares a candidate with Production by: the local
  adapter, whose loader is the MLflow loader for a registered version (``models:/NAME/VERSION`` from the
  settings' registry and model cache) or hands over a fitted estimator (the candidate, not registered
  yet). The model is loaded at start (a version that cannot load fails the call closed, as the registry's
  loader did), every row is predicted in one ``predict_many``, then the adapter is closed. A version
  whose model fails on the rows raises ``InferenceFailed``.

Nothing connects or loads until called.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any, TypeVar

from pydantic import BaseModel

from examlops.core.errors import InferenceFailed
from examlops.core.settings import Settings
from examlops.inference import InferenceSpec

if TYPE_CHECKING:
    from examlops.core.messages import ModelRef
    from examlops.inference import Inference
    from examlops.inference.adapters.examlops import ExamlopsTarget
    from examlops.registry.loader import Estimator
    from examlops.registry.retrain import HoldoutScorer
    from examlops.registry.synthetic import FloatArray

T = TypeVar("T")


class ModelRow(BaseModel):
    """One row as the registry's models take it: the embedding, then the node count."""

    embedding: list[float]
    node_count: float


class ModelPrediction(BaseModel):
    prediction: float


SCORE_VERSION = InferenceSpec(name="score_version", input=ModelRow, output=ModelPrediction)


def serving_inference(settings: Settings, route: str, target: ExamlopsTarget, *, url: str | None = None) -> Inference:
    from examlops.bootstrap.identity import platform_token
    from examlops.inference import Inference, Wiring

    shared = {"url": url or settings.serving.local_url, "token": platform_token(settings)}
    return Inference.from_wiring(Wiring({route: target}, adapters={"examlops": shared}))


def holdout_scorer(settings: Settings) -> HoldoutScorer:
    def score(model: ModelRef | Estimator, embeddings: FloatArray, node_count: FloatArray) -> FloatArray:
        import numpy as np

        from examlops.bootstrap.serving import mlflow_limits
        from examlops.core.messages import ModelRef
        from examlops.inference import Inference, Wiring
        from examlops.inference.adapters.local import LocalTarget
        from examlops.inference.loaders import BatchPredictor, Loader, SklearnBatchPredictor, mlflow_model

        loader: Loader
        if isinstance(model, ModelRef):
            loader = mlflow_model(
                f"models:/{model.name}/{model.version}",
                tracking_uri=settings.mlflow_tracking_uri,
                cache_dir=settings.state_dir / "cache" / "models",
                limits=mlflow_limits(settings),
            )
        else:
            fitted = model

            def loader() -> BatchPredictor:
                return SklearnBatchPredictor(fitted, "prediction")

        rows = [
            ModelRow(embedding=list(map(float, row)), node_count=float(count))
            for row, count in zip(embeddings, node_count, strict=True)
        ]

        async def predict() -> list[ModelPrediction]:
            async with Inference.from_wiring(Wiring({SCORE_VERSION.name: LocalTarget(loader)})) as inference:
                return await inference.model(SCORE_VERSION).predict_many(rows)

        from examlops.inference.errors import InferenceError, Kind

        try:
            predictions = run_sync(predict())
        except InferenceError as exc:
            if exc.kind is Kind.MODEL_FAILURE:  # the version cannot predict the held-out rows: say it as ours
                raise InferenceFailed(f"{exc}") from exc
            raise
        return np.asarray([p.prediction for p in predictions], dtype=np.float64)

    return score


def run_sync(coroutine: Coroutine[Any, Any, T]) -> T:
    """Run ``coroutine`` to its end from synchronous code, on a fresh loop in another thread when this one
    already runs a loop (a caller inside an async framework)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coroutine)
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, coroutine).result()
