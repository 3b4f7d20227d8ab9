"""The capacity of a server under open-loop arrivals: the highest rate it keeps up with (the knee).

A closed loop of c callers understates what a batching server answers when calls arrive on their own
(more calls wait, batches fill, each row costs less), so "2x the closed-loop capacity" need not be an
overload at all. ``knee`` offers open-loop Poisson arrivals of one body at rates rising geometrically
from a starting rate (``step`` times each rung) until a rung is not kept up with, then bisects between
the last rung kept up with and the first that was not. A rate is kept up with when every call of a
``seconds``-long run is answered 200, the p99 time is at most ``p99_ms``, and the queue did not grow: the
median time of the last quarter of the calls (by arrival) is at most ``GROWTH`` of ``p99_ms`` above that of
the quarter after the first tenth (the first tenth opens the client's connections). Past the knee the
queue grows for the whole run; the p99 alone let a rate a tenth above what the server holds pass a 4 s
probe, and such a knee overstated the capacity (bench/RESULTS.md). Each probe waits until the server's
queue is empty.

Figures only: nothing here asserts anything.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

from openloop import open_loop
from procs import drain, quantile

GROWTH = 0.2
"""How far (a share of ``p99_ms``) the last quarter's median time may rise above the early quarter's."""


@dataclass(frozen=True)
class Probe:
    rate: float
    calls: int
    answered: int
    p99_ms: float
    grew_ms: float
    """The median time of the last quarter of the answered calls (by arrival) less the early quarter's."""
    kept_up: bool


def grew_ms(answered: list[tuple[float, float]]) -> float:
    """The last quarter's median time less that of the quarter after the first tenth, of (arrival, time)
    pairs; nan (not kept up) with fewer than 20."""
    ordered = sorted(answered)
    quarter, tenth = len(ordered) // 4, len(ordered) // 10
    if tenth < 2:
        return float("nan")
    early = [t for _, t in ordered[tenth : tenth + quarter]]
    return quantile([t for _, t in ordered[-quarter:]], 0.5) - quantile(early, 0.5)


def probe(
    url: str, rate: float, body: bytes, *, seconds: float, p99_ms: float, headers: Mapping[str, str], seed: int
) -> Probe:
    """One open-loop run at ``rate`` calls/s; the calls wait ``p99_ms`` plus 1 s at most."""
    records = asyncio.run(
        open_loop(url, rate, seconds, lambda _rng: ("knee", p99_ms, body), headers=headers, seed=seed)
    )
    answered = [(r.sent_at, r.latency_ms) for r in records if r.status == 200]
    p99 = quantile([t for _, t in answered], 0.99) if answered else float("inf")
    grew = grew_ms(answered)
    kept_up = len(answered) == len(records) and p99 <= p99_ms and grew <= GROWTH * p99_ms
    return Probe(rate, len(records), len(answered), p99, grew, kept_up)


def knee(
    url: str,
    start: float,
    body: bytes,
    *,
    headers: Mapping[str, str],
    seconds: float = 4.0,
    p99_ms: float = 1000.0,
    step: float = 1.25,
    bisections: int = 3,
    limit: float = 16.0,
    say: Callable[[str], None] = print,
) -> tuple[float, list[Probe]]:
    """The highest rate kept up with (see the module docstring) and every probe, from ``start`` calls/s
    up to ``limit`` times it."""
    probes: list[Probe] = []

    def run(rate: float) -> bool:
        found = probe(url, rate, body, seconds=seconds, p99_ms=p99_ms, headers=headers, seed=len(probes) + 1)
        probes.append(found)
        verdict = "kept up" if found.kept_up else "fell behind"
        say(f"  knee probe {rate:7.1f} calls/s: {found.answered}/{found.calls} answered, "
            f"p99 {found.p99_ms:.1f} ms, grew {found.grew_ms:.0f} ms: {verdict}")  # fmt: skip
        parts = urlsplit(url)
        drain(f"{parts.scheme}://{parts.netloc}")  # its queue empties before the next probe
        return found.kept_up

    good, bad = 0.0, None
    rate = start
    while rate <= start * limit:
        if not run(rate):
            bad = rate
            break
        good, rate = rate, rate * step
    if bad is None:
        return good, probes
    low = good or bad / step**3  # even the start fell behind: bisect below it
    for _ in range(bisections):
        middle = (low + bad) / 2
        if run(middle):
            low = good = middle
        else:
            bad = middle
    return good, probes
