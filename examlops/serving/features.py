"""The feature transformer's checks (seed 000, step 5): each request of a batch against its catalog schema.

``validate_features`` gives one outcome per request, in order: a ``Features`` row for a good request, an
``InvalidInput`` naming the field for a bad one (which fails alone; its values are never echoed).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from numbers import Integral

import numpy as np
import numpy.typing as npt

from examlops.core.errors import InvalidInput
from examlops.core.messages import InferenceRequest
from examlops.registry.catalog import ModelSpec


@dataclass(frozen=True, slots=True)
class Features:
    """One validated request: its feature row (embedding then node count, float64) and its metadata."""

    row: npt.NDArray[np.float64]
    job_id: str | None
    user_id: str | None


def _node_count_error(value: object, spec: ModelSpec) -> InvalidInput | None:
    if isinstance(value, bool) or not isinstance(value, Integral):
        return InvalidInput("node_count must be an integer", field="node_count")
    if int(value) < spec.min_node_count:
        return InvalidInput(f"node_count must be at least {spec.min_node_count}", field="node_count")
    maximum = spec.input_schema.node_count.maximum
    if maximum is not None and int(value) > maximum:
        return InvalidInput(f"node_count must be at most {maximum}", field="node_count")
    return None


def _as_matrix(embeddings: list[tuple[float, ...]], dim: int) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.bool_]]:
    """The embeddings as a float64 matrix and which rows are numbers; only a bad batch goes row by row."""
    try:
        return np.asarray(embeddings, dtype=np.float64).reshape(len(embeddings), dim), np.ones(len(embeddings), bool)
    except (TypeError, ValueError):
        matrix = np.full((len(embeddings), dim), np.nan)
        numeric = np.zeros(len(embeddings), bool)
        for j, embedding in enumerate(embeddings):
            try:
                matrix[j] = np.asarray(embedding, dtype=np.float64)
                numeric[j] = True
            except (TypeError, ValueError):
                pass
        return matrix, numeric


def validate_features(
    requests: Sequence[InferenceRequest], specs: Sequence[ModelSpec]
) -> list[Features | InvalidInput]:
    """Check each request against its spec; one outcome per request, in order.

    A bad request gets an ``InvalidInput`` naming ``embedding`` or ``node_count`` and saying what is
    wrong in a few words (a count outside the catalog's bounds, values not finite or outside them); the
    values themselves are never echoed. The good ones get a row of ``embedding_dim + 1`` float64 values
    (layout ``embedding + [node_count]``), a view into one matrix per batch. The numeric checks run
    vectorised over all requests of the same embedding size.
    """
    outcomes: list[Features | InvalidInput | None] = [None] * len(requests)
    by_dim: dict[int, list[int]] = {}
    for i, (request, spec) in enumerate(zip(requests, specs, strict=True)):
        error = _node_count_error(request.node_count, spec)
        if error is None and len(request.embedding) != spec.embedding_dim:
            error = InvalidInput(
                f"expected {spec.embedding_dim} values, got {len(request.embedding)}", field="embedding"
            )
        if error is not None:
            outcomes[i] = error
        else:
            by_dim.setdefault(spec.embedding_dim, []).append(i)
    for dim, indices in by_dim.items():
        embeddings, numeric = _as_matrix([requests[i].embedding for i in indices], dim)
        not_finite = dim - np.count_nonzero(np.isfinite(embeddings), axis=1)
        schemas = [specs[i].input_schema.embedding for i in indices]
        low = np.array([-np.inf if e.minimum is None else e.minimum for e in schemas])[:, None]
        high = np.array([np.inf if e.maximum is None else e.maximum for e in schemas])[:, None]
        out_of_range = np.count_nonzero((embeddings < low) | (embeddings > high), axis=1)
        rows = np.empty((len(indices), dim + 1), dtype=np.float64)
        rows[:, :dim] = embeddings
        rows[:, dim] = [float(requests[i].node_count) for i in indices]
        for j, i in enumerate(indices):
            if not numeric[j]:
                outcomes[i] = InvalidInput("embedding values must be numbers", field="embedding")
            elif not_finite[j]:
                outcomes[i] = InvalidInput(f"{not_finite[j]} of {dim} values are not finite", field="embedding")
            elif out_of_range[j]:
                bounds = schemas[j]
                outcomes[i] = InvalidInput(
                    f"{out_of_range[j]} of {dim} values are outside [{bounds.minimum}, {bounds.maximum}]",
                    field="embedding",
                )
            else:
                outcomes[i] = Features(rows[j], requests[i].job_id, requests[i].user_id)
    return [outcome for outcome in outcomes if outcome is not None]
