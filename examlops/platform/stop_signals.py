"""How `exa up`'s supervisor is told to stop: ``StopSignals``, its SIGINT, SIGTERM and SIGHUP handlers.

Contract:

- ``installed()`` (a context manager, main thread) installs the handlers and restores the previous ones on
  exit;
- the first signal sets ``stopping`` and raises ``StopRequested`` wherever the main thread is, so that a wait
  ends at once; later signals are ignored (the stop under way finishes within its graces), as they are once
  ``stopping`` was set by hand;
- inside ``atomic()`` that first signal is held, and raised when the block ends (also when it raises on its
  own): raised inside a process start, between the fork and the bookkeeping, it would leave a child that
  nothing knows, and so nothing stops.
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator
from types import FrameType

SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class StopRequested(BaseException):
    """Raised from the signal handler to unwind whatever the supervisor was doing."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signame = signal.Signals(signum).name


class StopSignals:
    def __init__(self) -> None:
        self.stopping = False
        self._holding = False
        self._held: int | None = None

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        previous = {sig: signal.signal(sig, self._on_signal) for sig in SIGNALS}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        if self.stopping:
            return
        self.stopping = True
        if self._holding:
            self._held = signum
            return
        raise StopRequested(signum)

    @contextlib.contextmanager
    def atomic(self) -> Iterator[None]:
        """A stop signalled inside is raised when the block ends."""
        self._holding = True
        try:
            yield
        finally:
            self._holding = False
            held, self._held = self._held, None
            if held is not None:
                raise StopRequested(held)
