"""``adapters.redis.translated``: which redis-py errors become ``StoreUnavailable`` (retried) and which pass."""

from __future__ import annotations

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError

from examlops.adapters.redis import translated
from examlops.core.errors import StoreUnavailable


@pytest.mark.parametrize(
    "error",
    [
        RedisConnectionError("Connection refused"),
        ResponseError("OOM command not allowed when used memory > 'maxmemory'."),
        ResponseError("BUSY Redis is busy running a script."),
        ResponseError("READONLY You can't write against a read only replica."),
        RuntimeError("unable to perform operation on <TCPTransport closed=True reading=False>; the handler is closed"),
    ],
)
def test_an_unreachable_or_momentarily_refusing_redis_is_unavailable(error: Exception) -> None:
    with pytest.raises(StoreUnavailable, match="writing a reply"), translated("writing a reply"):
        raise error


@pytest.mark.parametrize(
    "error", [ResponseError("BUSYGROUP Consumer Group name already exists"), ResponseError("WRONGTYPE Operation")]
)
def test_other_error_replies_pass_unchanged(error: ResponseError) -> None:
    with pytest.raises(ResponseError) as raised, translated("creating groups"):
        raise error
    assert raised.value is error


def test_other_runtime_errors_pass_unchanged() -> None:
    error = RuntimeError("Event loop is closed")
    with pytest.raises(RuntimeError) as raised, translated("reading jobs"):
        raise error
    assert raised.value is error
