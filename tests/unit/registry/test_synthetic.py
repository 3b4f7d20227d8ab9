"""The synthetic generator: shapes, determinism, and a shift a drift detector can see."""

from __future__ import annotations

import numpy as np
import pytest

from examlops.core.errors import InvalidInput
from examlops.registry.synthetic import NODE_COUNT_COLUMN, feature_count, features, make_dataset, target


def test_shapes_and_types() -> None:
    x, nodes, y = make_dataset(50)
    assert x.shape == (50, 384) and x.dtype == np.float64
    assert nodes.shape == (50,) and nodes.dtype == np.int64 and nodes.min() >= 1
    assert y.shape == (50,) and y.dtype == np.float64
    assert np.isfinite(x).all() and np.isfinite(y).all()


def test_embeddings_are_roughly_unit_norm() -> None:
    x, _, _ = make_dataset(500)
    norms = np.linalg.norm(x, axis=1)
    assert 0.9 < norms.mean() < 1.1


def test_same_arguments_give_the_same_arrays_and_other_seeds_differ() -> None:
    first, second, other = make_dataset(20, seed=7), make_dataset(20, seed=7), make_dataset(20, seed=8)
    for a, b in zip(first, second, strict=True):
        np.testing.assert_array_equal(a, b)
    assert not np.array_equal(first[0], other[0])


def test_target_is_the_same_concept_for_every_seed() -> None:
    x, nodes, y = make_dataset(2000, seed=3)
    residual = y - target(x, nodes)
    assert abs(residual.mean()) < 0.02 and 0.08 < residual.std() < 0.12


def test_shift_moves_mean_and_scale_and_zero_shift_does_not() -> None:
    ref, _, _ = make_dataset(1000, seed=1)
    same, _, _ = make_dataset(1000, seed=2, shift=0.0)
    moved, _, _ = make_dataset(1000, seed=2, shift=1.0)
    assert abs(same.mean() - ref.mean()) < 0.01
    assert moved.mean() - ref.mean() > 0.04
    assert moved.std() > 1.3 * ref.std()


def test_shift_leaves_node_counts_alone() -> None:
    _, ref_nodes, _ = make_dataset(100, seed=4)
    _, moved_nodes, _ = make_dataset(100, seed=4, shift=1.0)
    np.testing.assert_array_equal(ref_nodes, moved_nodes)


def test_features_put_the_embedding_first_and_the_node_count_last() -> None:
    x, nodes, _ = make_dataset(5, dim=8)
    rows = features(x, nodes)
    assert rows.shape == (5, feature_count(8)) and rows.dtype == np.float64
    np.testing.assert_array_equal(rows[:, :8], x)
    np.testing.assert_array_equal(rows[:, NODE_COUNT_COLUMN], nodes.astype(np.float64))
    assert feature_count() == 385


def test_features_refuse_mismatched_inputs() -> None:
    x, nodes, _ = make_dataset(5, dim=8)
    with pytest.raises(InvalidInput):
        features(x, nodes[:4])
    with pytest.raises(InvalidInput):
        features(x[0], nodes[:1])


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError):
        make_dataset(-1)
    with pytest.raises(ValueError):
        make_dataset(5, shift=-0.5)
