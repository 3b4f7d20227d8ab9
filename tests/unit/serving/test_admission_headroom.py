"""Admission counts predict work at ``1 + headroom`` of what the cost model learnt (``AdmissionSettings``)."""

from __future__ import annotations

import pytest

from examlops.core.errors import Refused
from examlops.core.setting_sections import AdmissionSettings
from examlops.serving.admission import Estimator
from examlops.serving.waiters import InFlight
from tests.unit.serving.test_admission import FakeQueue, req

NOW = 100.0


def estimator(headroom: float, waiting: list[tuple[float, float, object]] | None = None) -> Estimator:
    queue = FakeQueue(waiting or [])  # type: ignore[arg-type]
    made = Estimator(AdmissionSettings(overhead_ms=2.0, headroom=headroom), queue, workers=1, max_size=1)
    made.costs.observe("JPCP", 1, 40.0)  # 40 ms a row
    return made


def test_the_default_headroom_is_positive() -> None:
    assert AdmissionSettings().headroom > 0.0


@pytest.mark.parametrize(("headroom", "admitted"), [(0.0, True), (0.25, False)])
def test_a_call_must_fit_its_budget_with_its_predict_work_slowed_by_the_headroom(
    headroom: float, admitted: bool
) -> None:
    # 40 ms of predict and 2 of overhead: within a 50 ms budget as learnt, 52 ms at 1.25.
    made = estimator(headroom)
    if admitted:
        assert made.admit("JPCP", NOW + 0.05, NOW) == pytest.approx(42.0)
        return
    with pytest.raises(Refused) as refused:
        made.admit("JPCP", NOW + 0.05, NOW)
    assert refused.value.estimate_ms == pytest.approx(52.0)  # the estimate that decided, with the headroom


def test_an_admitted_call_returns_the_estimate_without_the_headroom() -> None:
    # observe_error compares the actual time with what the cost model predicted, not with the guarded figure.
    assert estimator(0.5).admit("JPCP", NOW + 1.0, NOW) == pytest.approx(42.0)


@pytest.mark.parametrize(("headroom", "endangered"), [(0.0, False), (0.25, True)])
def test_the_calls_behind_are_endangered_by_their_work_and_this_calls_both_slowed_by_the_headroom(
    headroom: float, endangered: bool
) -> None:
    # The call behind has 100 ms left: its own 40 ms row and 2 ms of overhead leave a slack of 58 ms, more than
    # the tight call's 40 ms as learnt. At 1.25 its row takes 50 (slack 48) and the tight call's 50: endangered,
    # and only with both slowed (48 < 40 and 58 < 50 are false).
    behind = (NOW + 0.1, NOW + 0.1, req(1))
    assert estimator(headroom, [behind]).endangers("JPCP", NOW + 0.01, NOW) == endangered


def test_a_call_behind_that_can_meet_its_deadline_as_learnt_is_protected_though_the_headroom_says_it_misses() -> None:
    # 45 ms left: 3 ms to spare as learnt, 7 ms short at 1.25. The batcher still serves it (its rules use the
    # learnt time), so a tight call that would take its place is refused rather than make it late.
    behind = (NOW + 0.045, NOW + 0.045, req(1))
    assert estimator(0.25, [behind]).endangers("JPCP", NOW + 0.01, NOW)


@pytest.mark.parametrize(("headroom", "retry_after_s"), [(0.0, 1), (0.3, 2)])
def test_retry_after_is_the_wait_ahead_with_the_headroom(headroom: float, retry_after_s: int) -> None:
    ahead = [(NOW + 0.4, NOW + 0.4, req(1)) for _ in range(20)]  # 20 calls of 40 ms due before it: 800 ms
    with pytest.raises(Refused) as refused:
        estimator(headroom, ahead).admit("JPCP", NOW + 0.5, NOW)
    assert refused.value.retry_after_s == retry_after_s  # 0.8 s, or 1.04 s at 1.3


def test_the_margin_learns_only_the_lateness_beyond_the_headroom() -> None:
    made = estimator(0.25)  # a 42 ms estimate: 40 ms of predict, 10 of them headroom
    for _ in range(100):
        made.observe_error("JPCP", 10.0, NOW, estimate_ms=42.0)  # 10 ms late: within the headroom
    assert made.margin_ms("JPCP", NOW) == pytest.approx(0.0)
    for _ in range(100):
        made.observe_error("JPCP", 15.0, NOW, estimate_ms=42.0)  # 5 ms past the headroom: a margin near 10
    assert made.margin_ms("JPCP", NOW) == pytest.approx(10.0, abs=0.1)


def test_a_running_batch_is_counted_at_its_whole_expected_time_slowed_less_what_has_run() -> None:
    # A 40 ms batch started 20 ms ago: at 1.5 it takes 60 ms, so 40 are left (not 1.5 x the 20 left as learnt).
    queue = FakeQueue([], [InFlight(NOW - 0.02, [req(1)])])
    made = Estimator(AdmissionSettings(overhead_ms=2.0, headroom=0.5), queue, workers=1, max_size=1)
    made.costs.observe("JPCP", 1, 40.0)
    with pytest.raises(Refused) as refused:
        made.admit("JPCP", NOW + 0.05, NOW)
    assert refused.value.estimate_ms == pytest.approx(40.0 + 60.0 + 2.0)  # the batch's rest, its own 60, overhead
    assert made.estimate_ms("JPCP", NOW + 0.05, NOW)[0] == pytest.approx(20.0 + 40.0 + 2.0)  # as learnt
