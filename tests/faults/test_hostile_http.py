"""Hostile input at a running serving (`exa serve start` with the demo models): fuzzing, size limits, slow senders.

- schemathesis generates requests for every operation of serving's own OpenAPI
  schema (valid and invalid bodies, parameters, headers): no reply may be a
  5xx, and every 4xx must carry the documented error body (``error``, a text;
  ``prediction`` 0.0 outside the Open Inference Protocol's routes, whose error
  body is the protocol's).
- A body at the size limit is read; one byte over it is a 413 with the error
  body, whether it declares its Content-Length or is chunked.
- Slow senders (headers, or a body, trickled a byte at a time over many
  connections) are cut off by the header and body timeouts, while normal
  predictions keep being answered meanwhile.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections import Counter
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings

from examlops.identity.tokens import parse_token
from tests.faults.conftest import BODY_TIMEOUT_S, HEADER_TIMEOUT_S, LONG, MAX_BODY
from tests.integration.servers import ServingProcess

pytestmark = [
    pytest.mark.timeout(900 if LONG else 300),
    pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::UserWarning", "ignore::FutureWarning"),
]

PREDICT = {"model": "JPCP", "embedding": [0.01] * 384, "node_count": 12}


@pytest.fixture
def serving(hostile_serving: ServingProcess) -> ServingProcess:
    """The session's hostile serving (``conftest.hostile_serving``), shared with the permission fuzz."""
    return hostile_serving


def is_v2(path: str) -> bool:
    return path.startswith("/v2")


def test_every_route_answers_fuzzed_requests_without_a_5xx_and_with_the_error_body(serving: ServingProcess) -> None:
    """Each operation of serving's schema gets generated cases (positive and negative); failures are gathered
    per operation, so one bad route does not hide the others."""
    api = schemathesis.openapi.from_url(f"{serving.url}/openapi.json")
    failures: list[str] = []
    statuses: Counter[int] = Counter()
    operations = 0
    for result in api.get_all_operations():
        operation = result.ok()
        operations += 1

        @given(case=operation.as_strategy())
        @settings(
            max_examples=60 if LONG else 6,
            deadline=None,
            suppress_health_check=list(HealthCheck),
            phases=[Phase.explicit, Phase.generate],  # no shrinking: one failing example per route is enough
            database=None,
        )
        def fuzz(case: Any) -> None:
            response = case.call(headers=serving.auth, timeout=30)
            status = response.status_code
            statuses[status] += 1
            where = f"{case.method} {case.formatted_path}"
            assert status < 500, f"{where}: {status} {response.text[:300]}"
            if 400 <= status < 500 and case.path != "/metrics":
                body = response.json()
                assert isinstance(body.get("error"), str) and body["error"], f"{where}: {status} {body}"
                if not is_v2(case.path):
                    assert body.get("prediction") == 0.0, f"{where}: {status} {body}"

        try:
            fuzz()
        except AssertionError as exc:
            failures.append(str(exc).splitlines()[0])
    print(json.dumps({"scenario": "schemathesis over serving", "operations": operations, "statuses": statuses}))
    secret = parse_token(serving.token)[1]
    assert secret not in serving.log_path.read_text(errors="replace"), "the token's secret was logged"
    assert operations >= 20
    assert statuses[200] > 0 and statuses[401] == 0, statuses  # authenticated, and some cases were served
    assert failures == []


def post_raw(serving: ServingProcess, head: bytes, chunks: list[bytes]) -> bytes:
    with socket.create_connection(("127.0.0.1", serving.port), timeout=10) as sock:
        sock.sendall(head)
        for chunk in chunks:
            try:
                sock.sendall(chunk)
            except (BrokenPipeError, ConnectionResetError):
                break  # refused before it read the rest: what a limit is for
        answer = b""
        while True:
            try:
                part = sock.recv(65536)
            except ConnectionResetError:
                break
            if not part:
                break
            answer += part
    return answer


def request_head(serving: ServingProcess, extra: str) -> bytes:
    auth = serving.auth["Authorization"]
    return (
        f"POST /infer-pipeline/infer HTTP/1.1\r\nhost: 127.0.0.1\r\nauthorization: {auth}\r\n"
        f"content-type: application/json\r\n{extra}\r\n"
    ).encode()


def padded(size: int) -> bytes:
    """A JSON body of exactly ``size`` bytes."""
    head = b'{"model":"JPCP","node_count":12,"embedding":[0.01],"pad":"'
    return head + b"x" * (size - len(head) - 2) + b'"}'


def test_a_body_at_the_limit_is_read_and_one_byte_over_is_a_413_with_or_without_content_length(
    serving: ServingProcess,
) -> None:
    at_limit = httpx.post(
        f"{serving.url}/infer-pipeline/infer", content=padded(MAX_BODY), headers=serving.auth | JSON, timeout=30
    )
    assert at_limit.status_code == 422  # read and refused for its content, not its size
    over = padded(MAX_BODY + 1)
    declared = post_raw(serving, request_head(serving, f"content-length: {len(over)}\r\n"), [over])
    chunked = b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in (over[:40_000], over[40_000:])) + b"0\r\n\r\n"
    streamed = post_raw(serving, request_head(serving, "transfer-encoding: chunked\r\n"), [chunked])
    for answer in (declared, streamed):
        assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
        assert b'"prediction":0.0' in answer.replace(b" ", b""), answer[:400]


JSON = {"content-type": "application/json"}


def trickle(serving: ServingProcess, at_once: bytes, slowly: bytes, stop: threading.Event, cut: list[float]) -> None:
    """Send ``at_once``, then ``slowly`` a byte every 0.2 s until the server closes the connection; note when."""
    started = time.monotonic()
    try:
        with socket.create_connection(("127.0.0.1", serving.port), timeout=30) as sock:
            sock.sendall(at_once)
            for byte in slowly:
                if stop.is_set():
                    return
                sock.sendall(bytes([byte]))
                time.sleep(0.2)
                sock.setblocking(False)
                try:
                    if sock.recv(4096) == b"":
                        break
                except BlockingIOError:
                    pass
                finally:
                    sock.setblocking(True)
    except OSError:
        pass
    cut.append(time.monotonic() - started)


def test_slow_senders_are_cut_off_while_normal_predictions_are_answered(serving: ServingProcess) -> None:
    slow_headers = (b"", request_head(serving, "x-pad: " + "y" * 200 + "\r\n"))  # the headers a byte at a time
    body = padded(2048)
    slow_body = (request_head(serving, f"content-length: {len(body)}\r\n"), body)  # headers at once, then the body
    stop, cut = threading.Event(), []
    n = 60 if LONG else 20
    threads = [
        threading.Thread(
            target=trickle, args=(serving, *(slow_headers if i % 2 else slow_body), stop, cut), daemon=True
        )
        for i in range(n)
    ]
    for thread in threads:
        thread.start()
    answered = []
    try:
        with httpx.Client(base_url=serving.url, headers=serving.auth, timeout=10) as client:
            deadline = time.monotonic() + (HEADER_TIMEOUT_S + BODY_TIMEOUT_S + 3)
            while time.monotonic() < deadline:
                answered.append(client.post("/infer-pipeline/infer", json=PREDICT).status_code)
                time.sleep(0.05)
        for thread in threads:
            thread.join(HEADER_TIMEOUT_S + BODY_TIMEOUT_S + 10)
    finally:
        stop.set()
    assert answered and set(answered) == {200}, answered
    assert len(cut) == n, f"{n - len(cut)} slow senders were never cut off"


def embedding_body(embedding: str) -> bytes:
    return b'{"model":"JPCP","node_count":12,"embedding":' + embedding.encode() + b"}"


HOSTILE_BODIES = {
    "deep nesting": b'{"model":"JPCP","node_count":12,"embedding":' + b"[" * 5000 + b"]" * 5000 + b"}",
    "NaN": embedding_body("[" + ",".join(["0.1"] * 383 + ["NaN"]) + "]"),
    "Infinity": embedding_body("[" + ",".join(["0.1"] * 383 + ["Infinity"]) + "]"),
    "1e400": embedding_body("[" + ",".join(["0.1"] * 383 + ["1e400"]) + "]"),
    "383 values": embedding_body("[" + ",".join(["0.1"] * 383) + "]"),
    "385 values": embedding_body("[" + ",".join(["0.1"] * 385) + "]"),
    "strings in the embedding": embedding_body("[" + ",".join(['"0.1"'] * 384) + "]"),
    "an object for the embedding": embedding_body('{"a":1}'),
    "node_count as text": b'{"model":"JPCP","node_count":"12","embedding":[0.1]}',
    "node_count huge": b'{"model":"JPCP","node_count":1e300,"embedding":[0.1]}',
    "extra fields": embedding_body("[" + ",".join(["0.1"] * 384) + "]")[:-1] + b',"x":{"y":[1,2,3]},"__proto__":1}',
    "a list, not an object": b"[1,2,3]",
    "truncated JSON": b'{"model":"JPCP","embedding":[0.1,',
    "a NUL byte": b'{"model":"JP\x00CP","node_count":12,"embedding":[0.1]}',
    "invalid UTF-8": b'{"model":"\xff\xfe","node_count":12,"embedding":[0.1]}',
    "an unknown model": b'{"model":"' + b"Z" * 4000 + b'","node_count":12,"embedding":[0.1]}',
    "empty": b"",
}


@pytest.mark.parametrize("name", list(HOSTILE_BODIES))
@pytest.mark.parametrize("route", ["/infer-pipeline/infer", "/v1/models/JPCP/predict"])
def test_a_hostile_body_is_a_4xx_with_the_error_body_never_a_5xx(
    serving: ServingProcess, route: str, name: str
) -> None:
    response = httpx.post(
        f"{serving.url}{route}", content=HOSTILE_BODIES[name], headers=serving.auth | JSON, timeout=30
    )
    assert 400 <= response.status_code < 500, (response.status_code, response.text[:300])
    body = response.json()
    assert isinstance(body.get("error"), str) and body.get("prediction") == 0.0, body


def test_a_trace_page_past_what_sql_can_count_is_a_422_not_a_500(serving: ServingProcess) -> None:
    """Found by the fuzzing: an offset of 2**63 reached SQLite and came back an OverflowError, a 500."""
    response = httpx.get(f"{serving.url}/v1/traces", params={"offset": 2**63}, headers=serving.auth, timeout=30)
    assert response.status_code == 422, response.text[:300]
    assert response.json().get("prediction") == 0.0
