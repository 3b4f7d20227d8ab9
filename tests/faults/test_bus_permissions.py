"""The permission matrix on the bus: every identity x token state, signed jobs to a model's address, at once.

Real processes: a redis-server, a bridge (`exa bridge start`, with its recorder) and the serving stand-in;
identities in the cluster's SQL (`exa identity add`, one revoked) before the bridge starts. The space is
small enough to cover whole (each cell ``REPEAT`` times, every job in flight together), where the HTTP side
(``test_permission_fuzz.py``) draws from a larger one. What the bus promises (bus/README.md, "What a job
gets"), for a job to the JPCP address:

| token | the job gets |
|---|---|
| malformed | nothing is sent: the client cannot sign (``Unauthenticated``) |
| forged (a key id no identity has) | no reply; dead-lettered ``unknown_key`` |
| a known key id, a wrong secret | no reply; dead-lettered ``bad_signature`` |
| revoked | an ``unauthenticated`` reply |
| valid, outside its models (another model's caller, or narrowed to a task) | ``forbidden``, naming ``call`` |
| valid, allowed | the answer |

Must hold besides: only the allowed jobs reach serving and are recorded (the checker: nothing answered
twice, unrecorded or recorded without an answer; the only "lost" jobs are the dead-lettered ones), and no
token's secret is in any process's log.
"""

from __future__ import annotations

import asyncio
import secrets
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from examlops.bootstrap.bridge import bus_client
from examlops.bus import wire
from examlops.core.errors import Unauthenticated
from tests.faults.checker import check
from tests.faults.cluster import ADDRESS, PAYLOAD, TOKEN, Cluster
from tests.faults.conftest import LONG, Reporter
from tests.faults.history import History, Operation
from tests.integration.test_auth_http import _cli

pytestmark = [
    pytest.mark.timeout(600 if LONG else 180),
    # Seen once in a long run: a client's Redis transport closed while one of its dead-lettered jobs' waits
    # was still pending ("unclosed transport"); the figures and assertions had passed.
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
]

REPEAT = 20 if LONG else 3
TIMEOUT_S = 4.0
"""A dead-lettered job is never answered: its client waits this long."""
IDENTITIES = {  # name -> (role, narrowing), what each may do with the JPCP address
    "robot": ("caller", ["--model", "jpcp"]),
    "acbot": ("caller", ["--model", "ac"]),
    "tasker": ("caller", ["--task", "pavement.distress.jpcp"]),
    "console": ("operator", []),
}
ALLOWED = {"robot", "console"}
STATES = ["forged", "wrong_secret", "revoked", "valid"]


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[Cluster, dict[str, str]]]:
    cluster = Cluster(tmp_path)
    try:
        env = {"EXAMLOPS_HOME": str(tmp_path), "EXAMLOPS_TOKEN": TOKEN}
        tokens = {
            name: _cli(env, "identity", "add", name, "--role", role, *narrowing)["token"]
            for name, (role, narrowing) in {**IDENTITIES, "gone": ("caller", [])}.items()
        }
        _cli(env, "identity", "revoke", "gone")
        cluster.serving(delay_s=0.02)
        cluster.bridge()
        yield cluster, tokens
    finally:
        cluster.close()


def token_of(tokens: dict[str, str], who: str, state: str) -> str:
    key_id = tokens[who].split("_")[1]
    return {
        "forged": f"exa_{secrets.token_hex(8)}_{secrets.token_urlsafe(32)}",
        "wrong_secret": f"exa_{key_id}_{secrets.token_urlsafe(32)}",
        "revoked": tokens["gone"],
        "valid": tokens[who],
    }[state]


def expected(who: str, state: str) -> str | None:
    """The reply code a job should get ("dead" for none at all; None for the answer)."""
    if state in ("forged", "wrong_secret"):
        return "dead"
    if state == "revoked":
        return "unauthenticated"
    return None if who in ALLOWED else "forbidden"


def got(op: Operation) -> str | None:
    if op.value is None:
        return "dead" if op.error.startswith("DeadlineExceeded") else f"?{op.error[:80]}"
    return op.value.get("code")


async def test_every_identity_and_token_state_on_the_bus_gets_its_documented_reply_and_nothing_else_is_served(
    cluster: tuple[Cluster, dict[str, str]], report: Reporter
) -> None:
    cells, tokens = cluster
    history = History()
    presented: list[str] = []
    with pytest.raises(Unauthenticated):
        bus_client(cells.settings, token="not-a-token")  # a malformed token: nothing can be signed
    clients = {}
    for who in IDENTITIES:
        for state in STATES:
            token = token_of(tokens, who, state)
            presented.append(token)
            clients[(who, state)] = bus_client(cells.settings, token=token)
    try:
        ops = await asyncio.gather(
            *(
                history.bus_request(client, ADDRESS, PAYLOAD, TIMEOUT_S, f"{who}-{state}-{i}")
                for (who, state), client in clients.items()
                for i in range(REPEAT)
            )
        )
    finally:
        for client in clients.values():
            await client.close()
    figures = check(history, cells.redis.url, cells.settings)
    wrong = [
        (op.key, got(op), expected(*op.key.split("-")[:2])) for op in ops if got(op) != expected(*op.key.split("-")[:2])
    ]
    with redis.Redis.from_url(cells.redis.url, decode_responses=True) as r:
        dead = Counter(
            reason
            for _id, fields in r.xrange(wire.DEAD_STREAM)
            for reason in ("unknown_key", "bad_signature")
            if reason in str(fields)
        )
    forbidden = [op.value for op in ops if op.value and op.value.get("code") == "forbidden"]
    report(
        "bus permission matrix",
        f"{len(ops)} signed jobs at once: {len(IDENTITIES)} identities x {len(STATES)} token states x {REPEAT}",
        "forged tokens, wrong secrets, a revoked identity, identities outside the model",
        figures,
    )
    assert wrong == []
    assert sorted(figures.lost) == sorted(op.key for op in ops if expected(*op.key.split("-")[:2]) == "dead")
    assert figures.answered_twice == figures.unrecorded == figures.recorded_twice == []
    assert figures.recorded_unanswered == [] and figures.audit_ok
    assert dead == {"unknown_key": len(IDENTITIES) * REPEAT, "bad_signature": len(IDENTITIES) * REPEAT}
    assert all(body.get("permission") == "call" for body in forbidden)
    secrets_shown = [t.split("_", 2)[2] for t in presented]
    assert [path.name for s in secrets_shown for path in cells.logs_holding(s)] == []
