"""Deterministic synthetic data for the demo models, retraining and drift checks.

One sample is a section embedding (``dim`` floats, each vector of norm about 1)
and a mesh node count (an integer >= 1); the target is a smooth nonlinear
function of three fixed embedding directions and ``log(node_count)``, plus
noise. The directions depend only on ``dim``, never on ``seed``: every seed
draws new samples of the same concept, so a retrained model learns the same
function.

``shift`` moves the embedding distribution (every component gains
``0.05 * shift`` and the spread grows by ``50 % * shift``); ``shift=0`` is the
reference distribution. The node count distribution never moves.

Model rows are built by :func:`features`: the embedding, then the node count
as a float, in one float64 row of ``dim + 1`` columns. The serving pipeline
builds the same layout; :data:`NODE_COUNT_COLUMN` names where the count sits.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from examlops.core.errors import InvalidInput

EMBEDDING_DIM = 384
"""The embedding length of the demo catalog (seed 000, step 5)."""
NODE_COUNT_COLUMN = -1
"""Model rows hold the embedding first and the node count in the last column."""

# Fixed, so that the concept does not depend on the sample seed.
_CONCEPT_SEED = 20_000
_MEAN_SHIFT_PER_UNIT = 0.05
_SCALE_PER_UNIT = 0.5
_NOISE_STD = 0.1

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


def feature_count(embedding_dim: int = EMBEDDING_DIM) -> int:
    """Columns of a model row: the embedding then the node count (385 for 384)."""
    return embedding_dim + 1


def features(embeddings: FloatArray, node_count: npt.ArrayLike) -> FloatArray:
    """Build model rows, shape ``(n, dim + 1)`` float64: each embedding then its node count.

    Raises ``InvalidInput`` when ``embeddings`` is not 2-D or the counts do not
    match the rows one to one.
    """
    emb = np.asarray(embeddings, dtype=np.float64)
    counts = np.asarray(node_count, dtype=np.float64)
    if emb.ndim != 2:
        raise InvalidInput(f"embeddings must be 2-D (rows, dim), got shape {emb.shape}")
    if counts.shape != (emb.shape[0],):
        raise InvalidInput(f"node_count must have shape ({emb.shape[0]},), got {counts.shape}")
    return np.column_stack([emb, counts])


def _directions(dim: int) -> FloatArray:
    rng = np.random.default_rng([_CONCEPT_SEED, dim])
    w = rng.standard_normal((3, dim))
    normed: FloatArray = w / np.linalg.norm(w, axis=1, keepdims=True)
    return normed


def target(embeddings: FloatArray, node_count: npt.ArrayLike) -> FloatArray:
    """The noiseless concept: what a perfect model predicts for these samples."""
    emb = np.asarray(embeddings, dtype=np.float64)
    dim = emb.shape[1]
    # Unit directions on vectors of norm ~1 give projections of std 1/sqrt(dim): rescale to ~N(0, 1).
    p = emb @ _directions(dim).T * np.sqrt(dim)
    log_nodes = np.log(np.asarray(node_count, dtype=np.float64))
    y: FloatArray = np.sin(p[:, 0]) + 0.5 * np.tanh(p[:, 1]) * p[:, 2] + 0.3 * log_nodes
    return y


def make_dataset(
    n: int, *, dim: int = EMBEDDING_DIM, seed: int = 0, shift: float = 0.0
) -> tuple[FloatArray, IntArray, FloatArray]:
    """Draw ``n`` samples: ``(embeddings (n, dim) float64, node_count (n,) int64 >= 1, y (n,) float64)``.

    The same ``(n, dim, seed, shift)`` always gives the same arrays. Raises
    ``ValueError`` for ``n < 0``, ``dim < 3`` or a negative ``shift``.
    """
    if n < 0 or dim < 3 or shift < 0:
        raise ValueError(f"need n >= 0, dim >= 3 and shift >= 0 (got n={n}, dim={dim}, shift={shift})")
    rng = np.random.default_rng(seed)
    base = rng.standard_normal((n, dim)) / np.sqrt(dim)
    embeddings: FloatArray = base * (1.0 + _SCALE_PER_UNIT * shift) + _MEAN_SHIFT_PER_UNIT * shift
    node_count: IntArray = np.maximum(1, np.rint(rng.lognormal(mean=5.0, sigma=1.0, size=n))).astype(np.int64)
    y: FloatArray = target(embeddings, node_count) + rng.normal(0.0, _NOISE_STD, size=n)
    return embeddings, node_count, y
