"""The ports the serving core talks to. Adapters (MLflow, SQL) implement them.

The core (transformer, router, hot set, predict pool) imports neither redis
nor mlflow; the composition root (``examlops.bootstrap``) picks adapters.
Unit tests implement these with fakes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from examlops.core.messages import ModelRef

Rows = npt.NDArray[np.float64]
"""A 2-D float array: one row per request, the embedding then the node count."""


class Predictor(Protocol):
    """A loaded model: a scikit-learn estimator or anything with the same ``predict``."""

    def predict(self, rows: Any) -> Any: ...


ModelLoader = Callable[[str], Predictor]
"""Turns a local artifact location into a Predictor. Must be a top-level function
(it is sent to worker processes by reference) and may raise anything: the pool
turns any exception into ``ModelLoadError``."""


class ModelSource(Protocol):
    """Where model versions come from (the MLflow registry in production).

    Every method raises ``ModelNotFound``, ``AliasNotFound`` or
    ``VersionNotFound`` for what does not exist and ``RegistryUnavailable``
    when the registry cannot be reached.
    """

    def aliases(self, name: str) -> Mapping[str, ModelRef]:
        """Every alias of the model, by canonical alias name, with what it points at."""
        ...

    def resolve(self, name: str, alias: str) -> ModelRef:
        """The version one alias points at now (alias matched case-insensitively)."""
        ...

    def version(self, name: str, version: str) -> ModelRef:
        """One raw version."""
        ...

    def fetch(self, ref: ModelRef) -> str:
        """A local path of the version's artifact, downloading it if needed."""
        ...


class TrafficRuleStore(Protocol):
    """Where traffic splits are kept (SQL in production). Names are stored as given;
    lookups are case-insensitive."""

    def get(self, model: str) -> dict[str, int]:
        """The split of a model, alias -> weight; empty when none is set."""
        ...

    def set(self, model: str, weights: Mapping[str, int]) -> None:
        """Replace the split of a model; an empty mapping clears it."""
        ...


ControlEventSink = Callable[[str, str, Mapping[str, Any]], None]
"""Records one control action ``(event type, subject, data)``, e.g. ``("traffic.changed", "JPCP", {...})``,
on the audit trail. Blocking: the pipeline calls it from a worker thread. Raises ``StoreUnavailable`` when
the trail cannot be written: a traffic change is then not made; a reload, which stands, logs it."""


class Clock(Protocol):
    def __call__(self) -> float:
        """Monotonic seconds."""
        ...


class PredictRuntime(Protocol):
    """Runs predictions for loaded model versions (the predict pool in production).

    ``key`` names one loaded version (``"JPCP/3"``). ``predict`` returns one
    float per row, in row order, or raises: ``InferenceTimeout`` past the hard
    limit, ``InferenceFailed`` when the model raised or returned nothing,
    ``WorkerLost`` (retryable) when the worker died under the call.
    """

    async def start(self) -> None:
        """Start the workers; called once by the pipeline before anything is loaded."""
        ...

    async def close(self) -> None:
        """Stop every worker; pending calls fail. Called once by the pipeline on shutdown."""
        ...

    async def load(self, key: str, location: str) -> int | None:
        """Load a version so that ``predict`` can use it; ``ModelLoadError`` when it cannot be loaded.

        Returns how many input columns the loaded model declares (``n_features_in_``), or None
        when it does not say; the hot set refuses a version whose count does not match the catalog.
        """
        ...

    async def unload(self, key: str) -> None:
        """Release a version; unknown keys are ignored."""
        ...

    async def predict(self, key: str, rows: Rows) -> npt.NDArray[np.float64]: ...
