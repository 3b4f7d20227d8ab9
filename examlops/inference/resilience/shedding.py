"""Load shedding by criticality: under pressure, the calls that matter least fail fast first.

A route is under pressure while a throttled answer was seen within ``throttle_window_s`` or its breaker is
half-open. Then BEST_EFFORT calls are shed; once ``default_after`` throttled answers fall within the window,
DEFAULT calls are shed too. CRITICAL calls are never shed by the policy (an open breaker still refuses
them: that is the breaker, not shedding). A shed call fails before any I/O with
``InferenceError(THROTTLED, code="inference_shed")`` whose ``retry_after_s`` is when the last throttled
answer leaves the window (the pressure ends then if nothing new is seen).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from examlops.inference.context import Criticality
from examlops.inference.errors import InferenceError, Kind
from examlops.inference.resilience.policy import SheddingPolicy

SHED = "inference_shed"


class Shedder:
    """The pressure on one route and who is shed for it."""

    def __init__(self, policy: SheddingPolicy, *, route: str, backend: str, clock: Callable[[], float]) -> None:
        self._policy = policy
        self._route = route
        self._backend = backend
        self._clock = clock
        self._throttled: deque[float] = deque()

    def note_throttled(self) -> None:
        """The backend answered 'throttled' just now."""
        self._throttled.append(self._clock())

    def shed_below(self, *, half_open: bool) -> Criticality | None:
        """The lowest criticality that still goes through, or None when nothing is shed."""
        if not self._policy.enabled:
            return None
        count = self._recent()
        if count >= self._policy.default_after:
            return Criticality.CRITICAL
        if count or half_open:
            return Criticality.DEFAULT
        return None

    def sheds(self, criticality: Criticality, *, half_open: bool) -> bool:
        floor = self.shed_below(half_open=half_open)
        return floor is not None and criticality < floor

    def check(self, criticality: Criticality, *, half_open: bool) -> None:
        """Raise ``inference_shed`` when a call of ``criticality`` is shed now."""
        if not self.sheds(criticality, half_open=half_open):
            return
        retry_after = self._throttled[-1] + self._policy.throttle_window_s - self._clock() if self._throttled else 0.0
        raise InferenceError(
            Kind.THROTTLED,
            f"a {criticality.name} call to route {self._route!r} was shed: the backend is short",
            code=SHED,
            backend=self._backend,
            route=self._route,
            retry_after_s=max(0.0, retry_after),
        )

    def _recent(self) -> int:
        horizon = self._clock() - self._policy.throttle_window_s
        while self._throttled and self._throttled[0] < horizon:
            self._throttled.popleft()
        return len(self._throttled)
