"""``adapters.redis.connect_async``: commands packed by hiredis reach Redis as exactly the bytes redis-py's own
packer writes, whatever the arguments."""

from __future__ import annotations

import pytest
import redis.asyncio as aioredis

from examlops.adapters.redis import connect_async

COMMANDS: list[tuple[object, ...]] = [
    ("EVALSHA", "a" * 40, 2, "examlops:bus:jobs:x", "examlops:bus:addresses", "x", 100_000, "payload", "{}" * 5000),
    ("XADD", "s", "*", "body", '{"prediction":0.25,"model":"JPCP é ✓"}', "n", -7, "raw", b"\x00\xff"),
    ("CONFIG GET", "appendonly"),
    ("SET", "k", 0.1, "EX", 10),
    ("SET", "k", "\udcff lone surrogate"),
]


@pytest.mark.parametrize("args", COMMANDS)
def test_a_command_is_packed_to_the_bytes_redis_py_writes(args: tuple[object, ...]) -> None:
    ours = connect_async("redis://127.0.0.1:1/0").connection_pool.make_connection()
    plain = aioredis.Redis.from_url("redis://127.0.0.1:1/0", decode_responses=True, encoding_errors="replace")
    theirs = plain.connection_pool.make_connection()
    assert type(ours) is not type(theirs)
    assert b"".join(ours.pack_command(*args)) == b"".join(theirs.pack_command(*args))
    assert b"".join(ours.pack_commands([args, args])) == b"".join(theirs.pack_commands([args, args]))
