"""Hostile entries on a model's job stream, beside real jobs, at a running bridge.

Anything that can write to Redis can XADD to a job stream. Every such entry
must end in the dead letters (never a reply, never a record, never the reply
of the real job whose id it claims), the bridge must live on, and the real
jobs among them must each be answered and recorded once. The entries are
mutations, from a fixed seed, of jobs signed like the client's: a field
altered or dropped, another format, an unknown key id, a payload with NaN or a
deadline hours ahead signed with the right key, fields of random text, and
bytes that are not UTF-8.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import string
import time
from collections.abc import Iterator

import pytest
import redis

from examlops.bus import wire
from examlops.core.records import RECORDS_STREAM
from examlops.identity import bus_key_from_token
from examlops.identity.tokens import parse_token
from tests.faults.checker import check
from tests.faults.cluster import ADDRESS, PAYLOAD, TOKEN, Cluster, until
from tests.faults.conftest import LONG, Reporter
from tests.faults.history import History

pytestmark = pytest.mark.timeout(600 if LONG else 180)

HOSTILE = 600 if LONG else 60


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """One cluster with one bridge for every test here (each uses job ids of its own, and counts the dead letters
    it adds): the inputs that once killed a bridge (bytes that are not UTF-8) are fixed, and a test that kills
    it again fails on the bridge's death itself."""
    cluster = Cluster(tmp_path_factory.mktemp("hostile-bus"))
    try:
        cluster.serving()
        cluster.bridge()
        yield cluster
    finally:
        cluster.close()


def signed(job_id: str, reply_to: str, *, payload: str | None = None, deadline_in: float = 30) -> dict[str, str]:
    key_id, key = bus_key_from_token(TOKEN)
    fields = wire.encode_job(
        key_id, key, address=ADDRESS, job_id=job_id, reply_to=reply_to, deadline=time.time() + deadline_in,
        payload=PAYLOAD,
    )  # fmt: skip
    if payload is not None:  # a payload encode_job would refuse, signed all the same
        fields["payload"] = payload
        fields["sig"] = wire._job_signature(key, ADDRESS, fields)
    return fields


def mutations(rng: random.Random, reply_to: str, victims: list[str], n: int) -> list[dict[str, str | bytes]]:
    def text(k: int) -> str:
        return "".join(rng.choice(string.printable) for _ in range(k))

    made: list[dict[str, str | bytes]] = []
    for i in range(n):
        victim = rng.choice(victims)  # claim a real job's id: its reply must stay the real one
        fields: dict[str, str | bytes] = dict(signed(victim, reply_to))
        kind = i % 8
        if kind == 0:
            name = rng.choice(sorted(fields))
            fields[name] = text(rng.randint(0, 40))
        elif kind == 1:
            del fields[rng.choice(sorted(fields))]
        elif kind == 2:
            fields["v"] = "1"
        elif kind == 3:
            fields["key"] = "unknownkeyid"
        elif kind == 4:
            fields = dict(signed(victim, reply_to, payload='{"embedding":[NaN],"node_count":1}'))
        elif kind == 5:
            fields = dict(signed(victim, reply_to, deadline_in=7 * 3600))
        elif kind == 6:
            fields = {text(rng.randint(1, 8)): text(rng.randint(0, 200)) for _ in range(rng.randint(1, 9))}
        else:
            fields["payload"] = str(fields["payload"]) + text(3)  # altered after signing
        made.append(fields)
    return made


async def test_hostile_entries_are_dead_lettered_and_real_jobs_answered_once(shared: Cluster, report: Reporter) -> None:
    cluster = shared
    bridge = cluster.children[-1]
    history = History()
    raw = redis.Redis.from_url(cluster.redis.url)
    dead_before = raw.xlen(wire.DEAD_STREAM)
    async with cluster.client() as client:
        victims = [f"real-{i}" for i in range(HOSTILE // 2)]
        hostile = mutations(random.Random(23), client.reply_stream, victims, HOSTILE)

        async def real(job_id: str) -> None:
            await history.bus_request(client, ADDRESS, PAYLOAD, 20, job_id)

        jobs = [asyncio.create_task(real(v)) for v in victims]
        for fields in hostile:
            raw.xadd(wire.jobs_stream(ADDRESS), fields)  # type: ignore[arg-type]  # redis-py's loose typing
        await asyncio.gather(*jobs)
    await until(lambda: raw.xlen(wire.DEAD_STREAM) >= dead_before + HOSTILE, 30)
    assert bridge.alive(), bridge.logged()[-2000:]
    figures = check(history, cluster.redis.url, cluster.settings, settle_s=20)
    report(
        "hostile entries beside real jobs on a job stream",
        f"{len(victims)} real jobs at once, 1 bridge",
        f"{HOSTILE} hostile entries XADDed among them (fields altered or dropped, another format, an unknown key "
        "id, NaN and far deadlines signed right, random text)",
        figures,
    )
    assert figures.violations() == []
    assert figures.answered_with_error == 0 and figures.ok == len(victims)
    assert raw.xlen(wire.DEAD_STREAM) == dead_before + HOSTILE
    raw.close()
    assert cluster.logs_holding(parse_token(TOKEN)[1]) == []  # the token's secret is in no log


async def test_an_entry_that_is_not_utf8_is_dead_lettered_and_the_bridge_lives_on(shared: Cluster) -> None:
    cluster = shared
    bridge = cluster.children[-1]
    raw = redis.Redis.from_url(cluster.redis.url)
    dead_before = raw.xlen(wire.DEAD_STREAM)
    async with cluster.client() as client:
        fields: dict[str, str | bytes] = dict(signed("poisoned", client.reply_stream))
        fields["payload"] = b"\xff\xfe\xfa"
        raw.xadd(wire.jobs_stream(ADDRESS), fields)  # type: ignore[arg-type]  # redis-py's loose typing
        with contextlib.suppress(TimeoutError):  # a bridge that dies of it takes a few seconds to exit
            await until(lambda: not bridge.alive(), 6)
        assert bridge.alive(), bridge.logged()[-2000:]
        reply = await client.request(ADDRESS, PAYLOAD, 10)
    assert reply["error"] is None
    assert raw.xlen(wire.DEAD_STREAM) == dead_before + 1
    raw.close()


async def test_unreadable_records_are_dropped_and_later_jobs_still_recorded(shared: Cluster) -> None:
    cluster = shared
    history = History()
    raw = redis.Redis.from_url(cluster.redis.url)
    async with cluster.client() as client:
        await history.bus_request(client, ADDRESS, PAYLOAD, 10, "before-unreadable")
        raw.xadd(RECORDS_STREAM, {"r": "not a record", "job_id": "forged"})
        raw.xadd(RECORDS_STREAM, {"x": "y"})
        await history.bus_request(client, ADDRESS, PAYLOAD, 10, "after-unreadable")
    figures = check(history, cluster.redis.url, cluster.settings, settle_s=20)
    assert figures.violations() == []
    raw.close()


async def test_a_record_that_is_not_utf8_is_dropped_and_later_jobs_still_recorded(shared: Cluster) -> None:
    cluster = shared
    history = History()
    raw = redis.Redis.from_url(cluster.redis.url)
    async with cluster.client() as client:
        raw.xadd(RECORDS_STREAM, {"r": b"\xff\xfe", "job_id": "poisoned"})
        await asyncio.sleep(1.0)
        await history.bus_request(client, ADDRESS, PAYLOAD, 10, "after-not-utf8")
    figures = check(history, cluster.redis.url, cluster.settings, settle_s=5)
    assert figures.violations() == []
    raw.close()
