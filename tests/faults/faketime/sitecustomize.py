"""Imported at start-up (as ``sitecustomize``) only by the processes the clock-step scenario runs under libfaketime.

libfaketime 0.9.10 (Debian's) mistranslates ``clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME)`` when
``FAKETIME_DONT_FAKE_MONOTONIC`` is set (wolfcw/libfaketime#426), which Python 3.11's ``time.sleep`` calls: every
sleep raised ``OSError: [Errno 22]``, killing each thread that sleeps (a recording child's stop watch among them,
so its bridge waited 10 s on SIGTERM and then killed it). Here ``time.sleep`` waits with a relative ``select``
instead, which libfaketime passes through: the stepped processes then behave as a process with a stepped wall
clock does, and nothing else.
"""

import select
import time


def _sleep(seconds: float) -> None:
    if seconds < 0:
        raise ValueError("sleep length must be non-negative")
    select.select([], [], [], seconds)  # retried with the time left on EINTR (PEP 475)


time.sleep = _sleep
