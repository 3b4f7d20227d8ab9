"""The pure pieces of the HTTP edge: what counts as JSON, how a caller's string is echoed, the connection cap."""

from __future__ import annotations

import resource

import pytest

from examlops.api.errors import shown
from examlops.api.limits import is_json
from examlops.api.protocol import raw_error
from examlops.api.server import FILES_RESERVED, connection_limits
from examlops.core.settings import ServingSettings


@pytest.mark.parametrize(
    ("content_type", "expected"),
    [
        (b"application/json", True),
        (b"application/json; charset=utf-8", True),
        (b"Application/JSON", True),
        (b"application/vnd.examlops+json", True),
        (b"application/problem+json; charset=utf-8", True),
        (b"", False),
        (b"text/plain", False),
        (b"text/json", False),
        (b"application/x-www-form-urlencoded", False),
        (b"multipart/form-data; boundary=x", False),
        (b"application/jsonx", False),
    ],
)
def test_only_json_media_types_are_json(content_type: bytes, expected: bool) -> None:
    assert is_json(content_type) is expected


def test_a_callers_string_is_shown_as_at_most_a_short_prefix() -> None:
    assert shown("JPCP") == "JPCP"
    assert shown("m" * 64) == "m" * 64
    assert shown("m" * 4000) == "m" * 64 + "…"


def test_the_connection_cap_stays_under_the_open_files_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(resource, "getrlimit", lambda _: (300, 4096))
    assert connection_limits(ServingSettings(max_connections=1000)).max_connections == 300 - FILES_RESERVED
    assert connection_limits(ServingSettings(max_connections=50)).max_connections == 50
    monkeypatch.setattr(resource, "getrlimit", lambda _: (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    assert connection_limits(ServingSettings(max_connections=1000)).max_connections == 1000


def test_a_raw_refusal_is_a_whole_response_with_our_body_that_closes_the_connection() -> None:
    response = raw_error(503, "too_many_connections", "serving has too many open connections")
    head, _, body = response.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 503 Service Unavailable\r\n")
    assert b"\r\nconnection: close" in head
    assert f"content-length: {len(body)}".encode() in head
    assert b'"code":"too_many_connections"' in body and b'"prediction":0.0' in body
