"""The policy's configuration and the sliding quantile behind the hedge delay."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from examlops.inference.errors import Kind
from examlops.inference.resilience import Policy
from examlops.inference.resilience.quantile import SlidingQuantile


def test_an_empty_policy_has_working_defaults() -> None:
    policy = Policy.from_mapping(None)
    assert policy == Policy()
    assert policy.retry.max_attempts == 3
    assert policy.hedge.quantile == 0.95
    assert policy.hedge.budget_ratio == 0.1
    assert policy.breaker.failure_kinds == {Kind.THROTTLED, Kind.INFRASTRUCTURE}


def test_a_policy_loads_from_yaml_text_or_file(tmp_path: Path) -> None:
    text = """
retry: {max_attempts: 5, backoff_s: 0.2}
hedge: {quantile: 0.9, budget_ratio: 0.05}
breaker: {failure_threshold: 10, failure_kinds: [infrastructure, timeout]}
shedding: {default_after: 2}
"""
    path = tmp_path / "policy.yaml"
    path.write_text(text, encoding="utf-8")
    for source in (text, path):
        policy = Policy.from_yaml(source)
        assert policy.retry.max_attempts == 5
        assert policy.hedge.quantile == 0.9
        assert policy.breaker.failure_kinds == {Kind.INFRASTRUCTURE, Kind.TIMEOUT}
        assert policy.shedding.default_after == 2


def test_a_misspelt_setting_is_refused() -> None:
    with pytest.raises(ValidationError):
        Policy.from_mapping({"retry": {"max_attempt": 5}})


def test_a_backoff_longer_than_its_cap_is_refused() -> None:
    with pytest.raises(ValidationError):
        Policy.from_mapping({"retry": {"backoff_s": 5, "max_backoff_s": 1}})


def test_a_yaml_policy_that_is_not_a_mapping_is_refused() -> None:
    with pytest.raises(ValueError, match="mapping"):
        Policy.from_yaml("- retry")


def test_an_empty_window_has_no_quantile() -> None:
    assert SlidingQuantile(8).quantile(0.95) is None


def test_the_quantile_is_the_nearest_rank_of_the_window() -> None:
    window = SlidingQuantile(100)
    for value in range(100, 0, -1):
        window.add(float(value))
    assert window.quantile(0.95) == 95.0
    assert window.quantile(0.5) == 50.0
    assert window.quantile(1.0) == 100.0
    assert window.quantile(0.001) == 1.0


def test_the_window_forgets_its_oldest_observations() -> None:
    window = SlidingQuantile(4)
    for value in (100.0, 100.0, 100.0, 100.0, 1.0, 2.0, 3.0, 4.0):
        window.add(value)
    assert len(window) == 4
    assert window.quantile(1.0) == 4.0


def test_duplicates_leave_the_window_one_at_a_time() -> None:
    window = SlidingQuantile(3)
    for value in (5.0, 5.0, 1.0, 9.0):
        window.add(value)
    assert window.quantile(0.33) == 1.0
    assert window.quantile(0.66) == 5.0
    assert window.quantile(1.0) == 9.0
