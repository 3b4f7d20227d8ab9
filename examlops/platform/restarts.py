"""When `exa up` restarts a service that exited on its own: ``RestartBudget``, one per service.

Contract: ``exited()`` is called once per unexpected exit (a crash, a kill, a clean exit nobody asked for, a
restart that died before it was ready). It returns the seconds to wait before starting the service again
(``Backoff``: ``restart_backoff_s`` after the first exit in the window, doubling, at most
``restart_backoff_cap_s``), or None once the service has exited more than ``restart_limit`` times within
the last ``restart_window_s`` seconds: it keeps failing, and the supervisor stops restarting it. Exits older
than the window are forgotten, so a service that ran well for a window starts again from the first delay.
Restarts that never became ready (``exited(ready=False)``) are counted apart and never forgotten until one
start becomes ready (``ready()``): a service that cannot start is given up after ``restart_limit`` of them,
however long each takes to fail.
The clock is injected; nothing here sleeps.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

from examlops.core.backoff import Backoff
from examlops.core.control_sections import UpSettings


class RestartBudget:
    """One service's exits within the window, and what the next one means (module docstring)."""

    def __init__(self, policy: UpSettings, clock: Callable[[], float] = time.monotonic) -> None:
        self.policy = policy
        self.backoff = Backoff(policy.restart_backoff_s, max(policy.restart_backoff_s, policy.restart_backoff_cap_s))
        self.clock = clock
        self._exits: deque[float] = deque()
        self._failed_starts = 0
        self.restarts = 0
        """Restarts granted since the supervisor started."""

    def ready(self) -> None:
        """The service (re)started and became ready: failed starts are forgotten."""
        self._failed_starts = 0

    def exited(self, *, ready: bool = True) -> float | None:
        """Seconds before the restart, or None when the service keeps failing. ``ready`` False: this exit
        ended a start that never became ready."""
        now = self.clock()
        if not ready:
            self._failed_starts += 1
            if self._failed_starts > self.policy.restart_limit:
                return None
        while self._exits and now - self._exits[0] > self.policy.restart_window_s:
            self._exits.popleft()
        self._exits.append(now)
        if len(self._exits) > self.policy.restart_limit:
            return None
        self.restarts += 1
        return self.backoff.delay(len(self._exits))

    @property
    def recent(self) -> int:
        """Exits counted in the current window."""
        return len(self._exits)
