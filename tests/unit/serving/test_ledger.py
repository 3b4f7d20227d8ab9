"""The queue's ledger, and the admission estimate read from it against the same estimate made item by item."""

from __future__ import annotations

import math
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from examlops.core.setting_sections import AdmissionSettings
from examlops.serving.admission import Estimator
from examlops.serving.ledger import Ledger
from tests.unit.serving.test_admission import FakeQueue
from tests.unit.serving.test_pipeline import req

KEYS = st.sampled_from([0.5, 1.0, 2.0, math.inf]) | st.floats(0.0, 3.0)
OPS = st.lists(
    st.tuples(st.sampled_from(["add", "head", "any", "absent", "back"]), KEYS, st.booleans(), st.integers(0, 99))
)


@given(OPS)
def test_the_ledger_is_the_queue_in_order_whatever_comes_and_goes(ops: list[tuple[str, float, bool, int]]) -> None:
    ledger = Ledger(capacity=2)  # small, so it grows and recentres often
    queue: list[tuple[float, int, float, str]] = []
    for seq, (op, key, deadline, pick) in enumerate(ops):
        if op == "add" or not queue:
            item = (key, seq, key if deadline else math.inf, "odd" if pick % 2 else "even")
            ledger.add(*item)
            queue.append(item)
        elif op == "absent":
            assert not ledger.discard(key, 10**9)
        elif op == "back":  # taken, then put back (it did not fit a batch): its old seq among later ones
            item = queue[pick % len(queue)]
            assert ledger.discard(item[0], item[1])
            ledger.add(*item)
        else:
            item = min(queue) if op == "head" else queue[pick % len(queue)]
            queue.remove(item)
            assert ledger.discard(item[0], item[1])
        queue.sort()
        keys, dues, tallies = ledger.view()
        assert [(k, d, ledger.names[t]) for k, d, t in zip(keys, dues, tallies, strict=True)] == [
            (k, d, name) for k, _, d, name in queue
        ]


def reference(
    estimator: Estimator, waiting: list[tuple[float, float, str]], model: str, due: float, now: float
) -> tuple[float, bool]:
    """The estimate and the EDF test computed call by call, over the waiting calls in queue order (the
    admission module's docstrings say how)."""
    costs, size, workers = estimator.costs, 4, 2
    ahead = Counter(name for key, _, name in waiting if key <= due)
    queued_ms = costs.work_ms(ahead.items(), size)
    estimate = queued_ms / workers + costs.predict_ms(model, min(ahead[model] + 1, size)) + 2.0
    work_ms, endangered = 0.0, False
    for key, queued_due, name in waiting:
        work_ms += costs.predict_ms(name, size) / size
        if key <= due or key == math.inf or queued_due == math.inf:
            continue
        batch_rest_ms = (size - 1) * costs.predict_ms(name, size) / size  # its batch's other rows
        slack_ms = (queued_due - now) * 1000.0 - (work_ms + batch_rest_ms) / workers - 2.0
        endangered = endangered or 0.0 <= slack_ms < costs.predict_ms(model, size) / size / workers
    return estimate, endangered


@settings(max_examples=300)
@given(
    st.lists(st.tuples(st.floats(0.0, 0.5), st.booleans(), st.sampled_from(["JPCP", "CRCP"])), max_size=40),
    st.floats(0.0, 0.6),
    st.sampled_from(["JPCP", "CRCP"]),
)
def test_the_estimate_from_the_ledger_is_the_estimate_made_call_by_call(
    calls: list[tuple[float, bool, str]], due_in: float, model: str
) -> None:
    now = 100.0
    waiting = sorted((now + at, now + at if deadline else math.inf, name) for at, deadline, name in calls)
    queue = FakeQueue([(key, due, req(1, model=name)) for key, due, name in waiting])
    estimator = Estimator(AdmissionSettings(overhead_ms=2.0, headroom=0.0), queue, workers=2, max_size=4)
    for name, ms in (("JPCP", 8.0), ("CRCP", 30.0)):
        for size in (1, 2, 4):
            estimator.costs.observe(name, size, ms * (1 + size) / 2)
    estimate, endangered = reference(estimator, waiting, model, now + due_in, now)
    assert estimator.estimate_ms(model, now + due_in, now)[0] == pytest.approx(estimate)
    assert estimator.endangers(model, now + due_in, now) == endangered
