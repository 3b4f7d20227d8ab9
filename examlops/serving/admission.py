"""Admission control at the ingress (seed 001): estimate when a call would be answered, refuse it at once
when that, with a margin for the estimate's own error, is past its budget.

``Estimator`` learns, per model, the predict time by batch size (``serving.costs.CostModel``, fed by
every predict call) and reads the queue as the micro-batcher holds it:
the calls queued ahead of this one (deadline order: only those due no later), the batches being handled
and how long they have run. The estimate of a call is::

    (work queued ahead + work left in flight) / workers  +  its own batch's predict time  +  overhead

With ``per_model`` (the Ray engine: each model's replicas serve it alone, ``workers`` of them per model),
only the work of the call's own model counts, queued and in flight, over that model's workers.

A call that fits its own budget is still refused when it would push a call already admitted, queued
behind it (a later deadline), past a deadline that call can still meet (``endangers``): under EDF a tight
call jumps the queue, so without this test admitted calls would miss their budgets under overload.

Predict work is counted at ``1 + headroom`` of what the cost model learnt (``AdmissionSettings.headroom``):
under overload the ingress takes CPU from the workers, so batches run slower than they did when the calls
at a burst's onset were admitted. The margin below learns only the lateness beyond it.

It is a model, not a promise: each answered call's actual time less its estimate is recorded (the
``examlops_admission_error_ms`` histogram, so an operator sees whether to trust it) and fed back, with
the least error of each call refused late (``observe_error``): a call is admitted only when its estimate
plus twice the recent mean of the late part (the margin, fading with time) fits its budget, so the calls
admitted near their budget are not the ones the estimate's error pushes past it.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Protocol

import numpy as np
import numpy.typing as npt

from examlops.core.errors import Refused
from examlops.core.messages import InferenceRequest
from examlops.core.setting_sections import AdmissionSettings
from examlops.serving.costs import CostModel
from examlops.serving.ledger import Ledger
from examlops.serving.waiters import InFlight

MARGIN_ALPHA = 0.05
"""Weight of the newest answered call in the margin."""
MARGIN_HALF_LIFE_S = 1.0
"""The margin halves with every second without a call to learn from: a burst of late calls (a stall)
cannot leave a margin that refuses every call, and so is never corrected."""
OVERDUE_SHARE = 0.25
"""The share of its expected time a batch still running past it is counted as having left."""


class Queue(Protocol):
    """What the estimate reads of the micro-batcher (``serving.batcher.MicroBatcher``)."""

    @property
    def ledger(self) -> Ledger: ...

    def forming(self) -> list[tuple[float, float, InferenceRequest]]: ...

    def in_flight(self) -> list[InFlight[InferenceRequest]]: ...


def _ahead_of(keys: npt.NDArray[np.float64], key: float) -> int:
    """How many of the sorted ``keys`` are at most ``key``: the calls a new one of that key waits behind."""
    if not len(keys) or keys[0] > key:
        return 0
    if keys[-1] <= key:  # the common case of one shared budget: it goes last
        return len(keys)
    return int(np.searchsorted(keys, key, side="right"))


class Estimator:
    """Estimates a call's answer time from the cost model and the queue; decides admission."""

    def __init__(
        self, settings: AdmissionSettings, queue: Queue, *, workers: int, max_size: int, per_model: bool = False
    ) -> None:
        self.settings = settings
        self.costs = CostModel(settings.prior_ms)
        self._queue = queue
        self._workers = max(1, workers)
        self._max_size = max_size
        self._per_model = per_model
        self._margin: dict[str, tuple[float, float]] = {}  # model -> (margin ms, loop time it was set)

    def estimate_ms(
        self, model: str, due: float, now: float, rows: int = 1, *, running_ms: float | None = None
    ) -> tuple[float, float]:
        """(the estimated answer time of a call of ``rows`` rows to ``model`` due at loop time ``due``, the
        part of it spent waiting for the calls ahead), in milliseconds from ``now``, as the cost model learnt
        (no headroom). ``running_ms``: the work left in flight, when the caller has it already (``_running_ms``)."""
        queued_ms, own_ms = self._work(model, due, rows)
        if running_ms is None:
            running_ms = self._running_ms(now, model)
        return self._answer_ms(queued_ms, running_ms, own_ms)

    def _answer_ms(self, queued_ms: float, running_ms: float, own_ms: float, slow: float = 1.0) -> tuple[float, float]:
        """(answer time, wait) of a call behind ``queued_ms`` of work and ``running_ms`` in flight (already at
        ``slow``), with ``own_ms`` for its own batch: queued and own work at ``slow``."""
        wait_ms = (slow * queued_ms + running_ms) / self._workers
        return wait_ms + slow * own_ms + self.settings.overhead_ms, wait_ms

    def _work(self, model: str, due: float, rows: int) -> tuple[float, float]:
        """(predict time of the calls queued ahead of one due at ``due``, of its own batch), as learnt."""
        ledger = self._queue.ledger
        keys, _, tallies = ledger.view()
        ahead_of = _ahead_of(keys, due)
        ahead = Counter(request.model.lower() for key, _, request in self._queue.forming() if key <= due)
        if ahead_of:
            for tally, count in enumerate(np.bincount(tallies[:ahead_of]).tolist()):
                if count:
                    ahead[ledger.names[tally].lower()] += count
        if self._per_model:  # on Ray a model's replicas serve it alone: only its own calls are ahead
            ahead = Counter({model.lower(): ahead[model.lower()]})
        own = ahead[model.lower()]
        queued_ms = self.costs.work_ms(ahead.items(), self._max_size)
        return queued_ms, self.costs.predict_ms(model, min(own + rows, self._max_size))

    def observe_error(self, model: str, error_ms: float, now: float, *, estimate_ms: float) -> None:
        """An admitted call's actual time less its ``estimate_ms`` (``admit``'s; for a call refused late, the
        least it would have been), at loop time ``now``: the margin is twice the mean of its late part beyond
        the headroom already counted (``headroom`` x the estimate's predict part), weighted ``MARGIN_ALPHA``
        to the newest call, and fades with time (``MARGIN_HALF_LIFE_S``)."""
        late_ms = error_ms - self.settings.headroom * max(0.0, estimate_ms - self.settings.overhead_ms)
        old = self.margin_ms(model, now)
        self._margin[model.lower()] = (old + MARGIN_ALPHA * (2.0 * max(0.0, late_ms) - old), now)

    def margin_ms(self, model: str, now: float) -> float:
        """What a call to ``model`` needs to spare beyond its estimate to be admitted at loop time ``now``."""
        margin, since = self._margin.get(model.lower(), (0.0, now))
        return margin * 0.5 ** (max(0.0, now - since) / MARGIN_HALF_LIFE_S) if margin else 0.0

    def _running_ms(self, now: float, model: str, slow: float = 1.0) -> float:
        """Predict time left in the batches being handled (their ``model`` part only, per model), each taking
        ``slow`` times its expected time."""
        running_ms = 0.0
        part = model.lower() if self._per_model else ""
        for batch in self._queue.in_flight():
            expected_ms = batch.expected_ms.get(part)
            if expected_ms is None:  # the first estimate that sees the batch fixes its expected time
                items = [r for r in batch.items if r.model.lower() == part] if part else batch.items
                expected_ms = batch.expected_ms[part] = self.costs.lead_ms(items) if items else 0.0
            if not expected_ms:
                continue
            expected_ms *= slow
            elapsed_ms = (now - batch.started) * 1000.0
            # A batch past its expected time is not about to end: count a quarter of it still to come.
            running_ms += max(expected_ms - elapsed_ms, OVERDUE_SHARE * expected_ms)
        return running_ms

    def endangers(
        self, model: str, due: float, now: float, rows: int = 1, *, running: tuple[float, float] | None = None
    ) -> bool:
        """Whether a call of ``rows`` rows to ``model`` due at ``due`` would make a call already admitted,
        queued behind it (a later deadline), miss a deadline it can still meet: the EDF admission test. Every
        call behind it waits its share of ``rows`` more rows; a call that will miss anyway does not count.

        The queue's calls, in order, each add their model's per-row time to the work ahead of the next. A
        call is answered when its batch is, and calls after it (queued or still to come) can fill that batch,
        so its ``max_size - 1`` other rows count too. A call behind this one keeps ``slack`` = time to its
        deadline - (work ahead of it, its own row and its batch's rest) / workers - overhead, with the work at
        ``1 + headroom``; it is endangered when this call's extra work (at ``1 + headroom`` too) is more than
        that slack while the work as learnt would still let it meet its deadline. (Counting its own row
        alone let calls reach the head with too little time left for a full batch: batches of one then cost
        the queue several calls' time each.) The batch being formed is work ahead of every call, never one
        endangered: this call cannot join it. Array operations over the ledger: the same few at any queue
        length. ``running``: the work left in flight as learnt and at ``1 + headroom``, when the caller has it
        already (``_running_ms``)."""
        ledger = self._queue.ledger
        keys, dues, tallies = ledger.view()
        behind = _ahead_of(keys, due)
        if behind == len(keys):
            return False  # it goes last
        candidates = (keys[behind:] < math.inf) & (dues[behind:] < math.inf)
        mine = [name.lower() == model.lower() for name in ledger.names] if self._per_model else None
        if mine is not None and candidates.any():  # another model's calls, on its own replicas: not delayed
            candidates &= np.asarray(mine, dtype=bool)[tallies[behind:]]
        if not candidates.any():
            return False  # no admitted call with a deadline waits behind it
        slow = 1.0 + self.settings.headroom
        if running is None:
            running = self._running_ms(now, model), self._running_ms(now, model, slow)
        counted = mine or [True] * len(ledger.names)
        row_ms = np.array([self._row_ms(name) if own else 0.0 for name, own in zip(ledger.names, counted, strict=True)])
        forming_ms = sum(
            self._row_ms(request.model)
            for _, _, request in self._queue.forming()
            if mine is None or request.model.lower() == model.lower()
        )
        per_row = row_ms[tallies]
        batch_rest = (self._max_size - 1) * per_row[behind:]  # calls queued or still to come can fill its batch
        queued = forming_ms + np.cumsum(per_row)[behind:] + batch_rest  # until the batch of each call behind ends
        left_ms = (dues[behind:] - now) * 1000.0 - self.settings.overhead_ms
        can_meet = left_ms - (running[0] + queued) / self._workers >= 0.0
        slack_ms = left_ms - (running[1] + slow * queued) / self._workers
        extra_ms = slow * rows * self._row_ms(model) / self._workers
        return bool((candidates & can_meet & (slack_ms < extra_ms)).any())

    def _row_ms(self, model: str) -> float:
        """A row's share of a full batch of ``model``."""
        return self.costs.predict_ms(model, self._max_size) / self._max_size

    def admit(self, model: str, due: float, now: float, rows: int = 1) -> float:
        """The estimate (ms) of a call of ``rows`` rows (a stream's first chunk; one for a single call) that
        can be answered within its budget without making an admitted call miss its own (``endangers``);
        ``Refused`` (reason ``budget``) naming the estimate otherwise. The estimate must fit with the model's
        margin (``observe_error``) to spare and its predict work at ``1 + headroom``; the one returned is without
        either, what ``observe_error`` compares."""
        slow = 1.0 + self.settings.headroom
        queued_ms, own_ms = self._work(model, due, rows)
        running = self._running_ms(now, model), self._running_ms(now, model, slow)
        estimate, _ = self._answer_ms(queued_ms, running[0], own_ms)
        expected, wait_ms = self._answer_ms(queued_ms, running[1], own_ms, slow)
        guarded = expected + self.margin_ms(model, now)
        left_ms = (due - now) * 1000.0
        if self.settings.enabled and (guarded > left_ms or self.endangers(model, due, now, rows, running=running)):
            retry_after = max(self.settings.retry_after_s, wait_ms / 1000.0)
            raise Refused(
                f"no placement can answer within the budget without another call missing its own: "
                f"{guarded:.1f} ms estimated with the headroom and the error margin, {max(left_ms, 0):.1f} ms left",
                reason="budget",
                estimate_ms=round(guarded, 1),
                retry_after_s=math.ceil(retry_after),
            )
        return estimate
