"""Overload with serving's garbage-collector governor on and off, side by side in one run (issue 17).

``core.collector.LoadGovernor`` holds automatic collection off while ``serving.collector_pause_at`` calls
(128 by default) are in flight. Two admission-on ``exa serve start`` on the overload bench's state folder
(its heavy k-NN model, registered there once by ``overload.py``; ``overload.start_server``), one with the
defaults and one with ``EXAMLOPS_SERVING__COLLECTOR_PAUSE_AT=0`` (the collector as before), warmed as
``overload.py`` warms its servers. Then, for each rate of ``--rates``, ``--seconds`` of open-loop arrivals
(half ``--tight-ms``, half ``--loose-ms`` budgets) on each server in turn, the order alternating, each
queue drained before the next segment. Printed per segment and server: calls sent; early refusals and
their p50, p90, p99 and longest time (client side, HTTP included); the share of admitted calls answered
within budget and the calls refused late; goodput (answers within budget that came while arrivals lasted,
per second); the collector's pauses over the segment (``examlops_gc_pause_seconds`` from ``/metrics``):
how many, how many over 5 ms, their total, and how many the governor made at its cap
(``examlops_gc_held_collections_total``); and the machine's CPU stolen by the hypervisor.

    .venv/bin/python bench/collector_pause.py --rates 600 600 600 [--seconds 6] [--home PATH]

``--b-setting EXAMLOPS_NAME=VALUE`` (repeatable) gives the second server those settings instead of
``collector_pause_at=0`` (``EXAMLOPS_ADMISSION__HEADROOM=0``, say), for an A/B of any settings under overload
(the collector's columns are then each server's pauses, whatever its settings); ``--names`` names the two
servers in the output.

Figures only: nothing here asserts anything.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

sys.path.insert(0, str(Path(__file__).resolve().parent))
from demo import add_on_setting, on_settings
from openloop import Sent, open_loop
from overload import PATH, Server, mixed_budgets, segment_options, segment_state, start_server, warm
from overload_timeline import gc_pauses
from procs import StealMeter, drain, quantile, stop

OFF = {"EXAMLOPS_SERVING__COLLECTOR_PAUSE_AT": "0"}


def held_collections(url: str) -> float:
    """``examlops_gc_held_collections_total`` of serving's ``/metrics`` (0 without a governor)."""
    for family in text_string_to_metric_families(httpx.get(f"{url}/metrics", timeout=5).text):
        if family.name == "examlops_gc_held_collections":
            return sum(sample.value for sample in family.samples if sample.name.endswith("_total"))
    return 0.0


def row(name: str, records: list[Sent], seconds: float, pauses: dict[str, float], held: float, steal: float) -> str:
    sent = [r for r in records if r.sent]
    early = [r.latency_ms for r in sent if r.status == 503 and r.refused == "budget"]
    admitted = [r for r in sent if not (r.status == 503 and r.refused == "budget")]
    within = [r for r in admitted if r.status == 200 and r.latency_ms <= r.budget_ms]
    goodput = sum(1 for r in within if r.sent_at + r.latency_ms / 1000 <= seconds) / seconds
    late = sum(1 for r in sent if r.status == 503 and r.refused == "late")
    count = sum(pauses.get(f"n{g}", 0.0) for g in range(3))
    return (
        f"  {name:>8}: {len(sent):5d} sent, {len(early):5d} refused early "
        f"(p50 {quantile(early, 0.5):5.1f}, p90 {quantile(early, 0.9):5.1f}, p99 {quantile(early, 0.99):6.1f}, "
        f"max {quantile(early, 1.0):6.1f} ms); admitted within budget "
        f"{len(within) / len(admitted) if admitted else float('nan'):6.1%}, {late:4d} refused late; "
        f"goodput {goodput:5.0f}/s; collector {count:3.0f} pauses ("
        + "/".join(f"{pauses.get(f'n{g}', 0.0):.0f}" for g in range(3))
        + f" by generation), {count - pauses.get('short', 0.0):3.0f} over 5 ms, "
        f"{pauses.get('sum', 0.0) * 1000:5.0f} ms ({held:.0f} at the governor's cap); steal {steal:4.0%}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    segment_options(parser)
    add_on_setting(parser, "second server, instead of the collector's off", "--b-setting")
    parser.add_argument("--names", nargs=2, default=None, metavar=("A", "B"), help="The two servers' names.")
    args = parser.parse_args()
    b_env = on_settings(parser, args) or OFF
    names = args.names or (["governor", "off"] if b_env is OFF else ["defaults", "b"])

    _, home, headers, pool = segment_state(args)
    servers: list[tuple[str, Server]] = []
    try:
        servers.append((names[0], start_server(home, True, 1)))
        servers.append((names[1], start_server(home, True, 1, b_env)))
        for _, server in servers:
            warm(server.url, pool, args.loose_ms, headers)
        pick = mixed_budgets(pool, args.tight_ms, args.loose_ms)
        for index, rate in enumerate(args.rates):
            print(f"segment {index + 1}: {rate:g} calls/s for {args.seconds:g} s", flush=True)
            for name, server in servers if index % 2 == 0 else servers[::-1]:
                before, held, steal = gc_pauses(server.url), held_collections(server.url), StealMeter()
                records = asyncio.run(
                    open_loop(server.url + PATH, rate, args.seconds, pick, headers=headers, seed=args.seed + index)
                )
                after = gc_pauses(server.url)
                pauses = {key: after.get(key, 0.0) - before.get(key, 0.0) for key in after}
                held = held_collections(server.url) - held
                print(row(name, records, args.seconds, pauses, held, steal.share()), flush=True)
                drain(server.url)
                time.sleep(1.0)
    finally:
        for _, server in servers:
            stop(server.process)


if __name__ == "__main__":
    main()
