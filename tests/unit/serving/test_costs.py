"""The cost model: a line through the predict times of every batch size seen, per model."""

from __future__ import annotations

import pytest

from examlops.serving.costs import CostModel


def test_a_model_never_seen_takes_the_prior() -> None:
    assert CostModel(prior_ms=5.0).predict_ms("JPCP", 32) == 5.0


def test_batches_of_several_sizes_give_the_fixed_and_the_per_row_time() -> None:
    costs = CostModel(prior_ms=5.0)
    for _ in range(3):
        for size in (1, 4, 16, 32):
            costs.observe("JPCP", size, 45.0 + 2.0 * size)  # a k-NN: a large fixed cost, 2 ms a row
    assert costs.predict_ms("JPCP", 8) == pytest.approx(61.0)
    assert costs.predict_ms("jpcp", 64) == pytest.approx(173.0)  # names match as the catalog's do


def test_batches_all_of_one_size_give_a_time_per_row() -> None:
    costs = CostModel(prior_ms=5.0)
    costs.observe("JPCP", 32, 128.0)
    assert costs.predict_ms("JPCP", 32) == pytest.approx(128.0)
    assert costs.predict_ms("JPCP", 8) == pytest.approx(32.0)
    assert costs.work_ms([("JPCP", 66)], max_size=32) == pytest.approx(2 * 128.0 + 8.0)


def test_one_slow_batch_is_corrected_by_the_calls_after_it_whatever_their_size() -> None:
    costs = CostModel(prior_ms=5.0)
    costs.observe("JPCP", 32, 3000.0)  # a stall (a first call, a busy machine) at the largest size
    for _ in range(40):  # the batcher then forms smaller batches only
        for size in (1, 2, 4, 8):
            costs.observe("JPCP", size, 10.0 + 4.0 * size)
    assert costs.predict_ms("JPCP", 32) == pytest.approx(138.0, rel=0.05)  # the stall is forgotten


def test_lead_is_the_slowest_models_group_of_a_batch() -> None:
    from tests.unit.serving.test_pipeline import req

    costs = CostModel(prior_ms=5.0)
    costs.observe("JPCP", 2, 20.0)
    costs.observe("CRCP", 1, 50.0)
    assert costs.lead_ms([req(1), req(1), req(1, model="crcp")]) == pytest.approx(50.0)


def test_batches_that_take_the_same_time_at_every_size_give_a_flat_line() -> None:
    costs = CostModel(prior_ms=5.0)
    for size in (1, 2, 4, 8, 16, 32) * 3:
        costs.observe("JPCP", size, 100.0)
    assert costs.predict_ms("JPCP", 2) == pytest.approx(100.0)
    assert costs.predict_ms("JPCP", 32) == pytest.approx(100.0)
