"""What one admission-on server does, half-second by half-second, through segments of open-loop overload (issue 17).

``bench/overload.py`` gives each load's totals; this shows how a segment unfolds, from the server's own
traces. One ``exa serve start`` on the overload bench's state folder (its heavy k-NN model, registered
there once by ``overload.py``), with admission and tracing on, warmed as ``overload.py`` warms its servers,
then ``--seconds`` of the same open-loop arrivals (half ``--tight-ms``, half ``--loose-ms`` budgets) at each
rate of ``--rates``, the queue drained between segments. Printed per segment:

- the client's side: calls sent, the share of admitted calls answered within budget, goodput (answers
  within budget that came while arrivals lasted, per second), early refusals' p50, p90 and p99;
- the garbage collector's pauses over the segment (``examlops_gc_pause_seconds`` from ``/metrics``): how
  many by generation, their total, and how many took over 5 ms;
- by half-second of arrival (the client's own records): tight and loose calls answered within budget,
  admitted but not answered in time (refused late: expired or hopeless in the queue; answered late; given
  up), and refused early;
- the predict batches, in the order they were handed to the worker (a member's arrival plus its queue
  wait): when, size, predict time, and how many of its calls were tight.

Tracing costs the server some CPU: the figures are for reading a segment's shape, not for the issue's bounds.

    .venv/bin/python bench/overload_timeline.py --rates 326 652 652 [--seconds 6] [--home PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import select

sys.path.insert(0, str(Path(__file__).resolve().parent))
from openloop import Sent, open_loop
from overload import PATH, mixed_budgets, segment_options, segment_state, start_server, warm
from procs import drain, quantile, stop

from examlops.bootstrap.sql import sql_engine
from examlops.core.settings import Settings
from examlops.tracing.sql_store import Trace

BIN_S = 0.5


def gc_pauses(url: str) -> dict[str, float]:
    """``examlops_gc_pause_seconds`` as counts (``n0``, ``n1``, ``n2``), total seconds (``sum``) and the count
    at or under 5 ms (``short``), from serving's ``/metrics``."""
    out: dict[str, float] = defaultdict(float)
    for family in text_string_to_metric_families(httpx.get(f"{url}/metrics", timeout=5).text):
        if family.name != "examlops_gc_pause_seconds":
            continue
        for sample in family.samples:
            generation = sample.labels.get("generation", "")
            if sample.name.endswith("_count"):
                out[f"n{generation}"] += sample.value
            elif sample.name.endswith("_sum"):
                out["sum"] += sample.value
            elif sample.name.endswith("_bucket") and sample.labels.get("le") == "0.005":
                out["short"] += sample.value
    return dict(out)


Row = tuple[float, str | None, int | None, float | None, float | None, str, str, float | None]


def _stamp(at: datetime) -> float:
    return (at if at.tzinfo else at.replace(tzinfo=UTC)).timestamp()  # SQLite hands datetimes back naive


def traces(settings: Settings, since: float, until: float) -> list[Row]:
    """(arrival, batch id, batch size, predict ms, queue wait ms, outcome, error code, budget ms) of the calls
    that arrived between ``since`` and ``until`` (UNIX seconds)."""
    table = Trace.__table__  # type: ignore[attr-defined]  # SQLModel's table
    columns = [table.c[name] for name in ("at", "batch_id", "batch_size", "predict_ms", "queue_wait_ms", "outcome",
                                          "error_code", "budget_ms")]  # fmt: skip
    start, end = datetime.fromtimestamp(since, UTC), datetime.fromtimestamp(until, UTC)
    engine = sql_engine(settings)
    try:
        with engine.connect() as connection:
            rows = connection.execute(select(*columns).where(table.c.at >= start, table.c.at <= end)).all()
    finally:
        engine.dispose()
    return [(_stamp(r[0]), *r[1:]) for r in rows]


def report_client(records: list[Sent], seconds: float) -> None:
    early = [r.latency_ms for r in records if r.status == 503 and r.refused == "budget"]
    admitted = [r for r in records if not (r.status == 503 and r.refused == "budget")]
    within = [r for r in admitted if r.status == 200 and r.latency_ms <= r.budget_ms]
    goodput = sum(1 for r in within if r.sent_at + r.latency_ms / 1000 <= seconds) / seconds
    share = len(within) / len(admitted) if admitted else float("nan")
    print(f"  client: {len(records)} sent, {len(admitted)} admitted, {share:.1%} of them within budget, goodput "
          f"{goodput:.0f}/s; early refusals {len(early)}: p50 {quantile(early, 0.5):.1f}, "
          f"p90 {quantile(early, 0.9):.1f}, p99 {quantile(early, 0.99):.1f} ms")  # fmt: skip


def timeline(records: list[Sent], rows: list[Row], tight_ms: float) -> Iterator[str]:
    """The segment's arrivals by half-second (the client's records: what each caller got) and its batches
    (the server's traces), each in seconds from the segment's start as its side saw it."""
    bins: dict[float, Counter[str]] = defaultdict(Counter)
    for record in records:
        kind = "T" if record.budget_ms <= tight_ms else "L"
        slot = int(record.sent_at / BIN_S) * BIN_S
        if record.status == 200:
            bins[slot][f"{kind} within" if record.latency_ms <= record.budget_ms else f"{kind} late"] += 1
        elif record.status == 503 and record.refused == "budget":
            bins[slot][f"{kind} early"] += 1
        else:  # refused late (expired or hopeless in the queue), given up, or another error
            bins[slot][f"{kind} late"] += 1
    yield "  arrivals (s)  tight: within not early | loose: within not early   (not: admitted, no answer in time)"
    for slot in sorted(bins):
        c = bins[slot]
        yield (f"  {slot:5.1f}        {c['T within']:5d} {c['T late']:4d} {c['T early']:5d} |"
               f" {c['L within']:6d} {c['L late']:4d} {c['L early']:5d}")  # fmt: skip
    start = min((row[0] for row in rows), default=0.0)
    batches: dict[str, list[tuple[float, int, float, bool]]] = defaultdict(list)
    for at, batch_id, size, predict_ms, wait_ms, _, _, budget in rows:
        if batch_id and predict_ms is not None and wait_ms is not None:
            tight = budget is not None and budget <= tight_ms
            batches[batch_id].append((at - start + wait_ms / 1000, size or 0, predict_ms, tight))
    yield "  batches: handed over (s), size, predict ms, tight calls"
    ordered = sorted(batches.values(), key=lambda members: min(m[0] for m in members))
    line: list[str] = []
    for members in ordered:
        first, size, predict_ms = min(m[0] for m in members), members[0][1], members[0][2]
        line.append(f"{first:5.2f}:{size}/{predict_ms:.0f}/{sum(m[3] for m in members)}")
        if len(line) == 6:
            yield "    " + "  ".join(line)
            line = []
    if line:
        yield "    " + "  ".join(line)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    segment_options(parser)
    args = parser.parse_args()

    settings, home, headers, pool = segment_state(args)
    server = start_server(home, True, 1, {"EXAMLOPS_TRACING__ENABLED": "true"})
    try:
        warm(server.url, pool, args.loose_ms, headers)
        pick = mixed_budgets(pool, args.tight_ms, args.loose_ms)
        for index, rate in enumerate(args.rates):
            before, began = gc_pauses(server.url), time.time()
            records = asyncio.run(
                open_loop(server.url + PATH, rate, args.seconds, pick, headers=headers, seed=args.seed + index)
            )
            ended, after = time.time(), gc_pauses(server.url)
            drain(server.url)
            print(f"segment {index + 1}: {rate:g} calls/s for {args.seconds:g} s")
            report_client(records, args.seconds)
            pauses = {key: after.get(key, 0.0) - before.get(key, 0.0) for key in after}
            count = sum(pauses.get(f"n{g}", 0.0) for g in range(3))
            print(f"  garbage collector: {pauses.get('n0', 0):.0f} / {pauses.get('n1', 0):.0f} / "
                  f"{pauses.get('n2', 0):.0f} pauses by generation, {pauses.get('sum', 0) * 1000:.0f} ms in all, "
                  f"{count - pauses.get('short', 0):.0f} over 5 ms")  # fmt: skip
            time.sleep(1.5)  # the trace writer's batch (about a second)
            for line in timeline(records, traces(settings, began - 0.5, ended), args.tight_ms):
                print(line)
    finally:
        stop(server.process)


if __name__ == "__main__":
    main()
