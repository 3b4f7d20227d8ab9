"""Admission counts predict work at ``1 + headroom`` of what the cost model learnt (``AdmissionSettings``)."""

from __future__ import annotations

import pytest

from examlops.core.errors import Refused
from examlops.core.setting_sections import AdmissionSettings
from examlops.serving.admission import Estimator
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
def test_the_calls_behind_are_endangered_by_their_work_slowed_by_the_headroom(
    headroom: float, endangered: bool
) -> None:
    # The call behind has 90 ms left: its own 40 ms row and 2 ms of overhead leave a slack of 48 ms, more than
    # the tight call's 40 ms as learnt; at 1.25 its row takes 50 and the tight call's 50: slack 38 < 50.
    behind = (NOW + 0.09, NOW + 0.09, req(1))
    assert estimator(headroom, [behind]).endangers("JPCP", NOW + 0.01, NOW) == endangered
