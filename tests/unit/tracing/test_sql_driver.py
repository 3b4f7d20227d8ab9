"""``sqlite_at``: the text SQLAlchemy's SQLite ``DateTime`` stores, rounded as ``datetime`` rounds."""

from __future__ import annotations

import random
from datetime import UTC, datetime

import pytest

from examlops.tracing.sql_driver import sqlite_at


def reference(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).isoformat(" ", "microseconds")[:26]


@pytest.mark.parametrize(
    "at",
    [
        0.0,
        1_733_500_000.0,
        1_733_500_000.9999995,  # rounds up into the next second
        1_733_500_000.9999994,
        1_733_500_000.0000005,  # half a microsecond: even rounding
        1_733_500_000.0000015,
        1_733_500_059.9999999,  # the next minute
        1_735_689_599.9999999,  # the next year
        -0.25,
        -1.9999999,
    ],
)
def test_edges_read_as_datetime_writes_them(at: float) -> None:
    assert sqlite_at(at) == reference(at)


def test_any_order_of_seconds_reads_as_datetime_writes_them() -> None:
    draw = random.Random(16)
    times = [1_733_500_000 + draw.uniform(-5, 5) for _ in range(20_000)]
    times += [float(draw.randrange(0, 4_000_000_000)) + draw.random() for _ in range(2_000)]
    assert [sqlite_at(at) for at in times] == [reference(at) for at in times]
