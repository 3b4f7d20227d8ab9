"""A small HTTP client for the serving API, used by `exa serve ...` and `exa predict`.

httpx errors are translated here: an unreachable server is ``PipelineUnavailable``
(exit 3), and an error reply becomes the error its ``code`` names (a refusal is ``Refused``). ``stream``
reads a stream route's NDJSON lines as they arrive.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, BinaryIO

import httpx
import orjson

from examlops.core import errors

_BY_STATUS: dict[int, type[errors.ExamlopsError]] = {
    401: errors.Unauthenticated,
    404: errors.NotFound,
    409: errors.Conflict,
    413: errors.PayloadTooLarge,
    422: errors.InvalidInput,
    503: errors.NotReady,
    504: errors.InferenceTimeout,
}


class ServingClient:
    def __init__(self, base_url: str, *, token: str | None = None, timeout_s: float = 30.0) -> None:
        """``token`` is sent as ``Authorization: Bearer``; it is never printed, even in an error."""
        self.base_url = base_url.rstrip("/")
        self._timeout_s = timeout_s
        headers = {"Authorization": f"Bearer {token}"} if token else None
        self._http = httpx.Client(
            base_url=self.base_url, timeout=httpx.Timeout(timeout_s, connect=5.0), headers=headers
        )

    def __enter__(self) -> ServingClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self._http.close()

    def request(self, method: str, path: str, *, json: Any = None, ok: tuple[int, ...] = (200,)) -> Any:
        try:
            response = self._http.request(method, path, json=json)
        except httpx.TransportError as exc:
            raise errors.PipelineUnavailable(f"serving at {self.base_url} cannot be reached ({exc})") from exc
        body = _json_of(response)
        if response.status_code in ok:
            return body
        raise _error_of(response.status_code, body, path)

    def stream(self, path: str, *, json: Any, read_timeout_s: float | None = None) -> Iterator[dict[str, Any]]:
        """POST ``json`` to a stream route and yield each NDJSON line as it arrives; an error reply (sent
        before any line) raises as ``request`` does. ``read_timeout_s``: the longest wait for one line."""
        timeout = httpx.Timeout(self._timeout_s if read_timeout_s is None else read_timeout_s, connect=5.0)
        try:
            with self._http.stream("POST", path, json=json, timeout=timeout) as response:
                if response.status_code != 200:
                    response.read()
                    raise _error_of(response.status_code, _json_of(response), path)
                for line in response.iter_lines():
                    if line.strip():
                        yield orjson.loads(line)
        except httpx.TransportError as exc:
            raise errors.PipelineUnavailable(f"serving at {self.base_url} cannot be reached ({exc})") from exc

    def get(self, path: str, *, ok: tuple[int, ...] = (200,)) -> Any:
        return self.request("GET", path, ok=ok)

    def download(self, path: str, sink: BinaryIO) -> int:
        """Stream a 200 reply's body into ``sink``; the bytes written. Errors as ``request``."""
        try:
            with self._http.stream("GET", path) as response:
                if response.status_code != 200:
                    response.read()
                    raise _error_of(response.status_code, _json_of(response), path)
                written = 0
                for chunk in response.iter_bytes():
                    sink.write(chunk)
                    written += len(chunk)
                return written
        except httpx.TransportError as exc:
            raise errors.PipelineUnavailable(f"serving at {self.base_url} cannot be reached ({exc})") from exc


def _json_of(response: httpx.Response) -> Any:
    try:
        return response.json()
    except ValueError:
        return {"error": response.text[:200]}


def _error_of(status: int, body: Any, path: str) -> errors.ExamlopsError:
    """The error an error reply names (its ``code``, else its status)."""
    message = body.get("error") if isinstance(body, dict) else None
    text = message or f"HTTP {status} from {path}"
    details = body if isinstance(body, dict) else {}
    if status == 401:
        from examlops.cli.output import token_hint

        return errors.Unauthenticated(f"{text} ({token_hint()})")
    if status == 403:
        return errors.Forbidden(text, permission=str(details.get("permission") or ""))
    if details.get("code") == "refused":
        return errors.Refused(
            text, reason=str(details.get("refused") or "budget"), estimate_ms=details.get("estimate_ms")
        )
    kind = _BY_STATUS.get(status, errors.InferenceFailed)
    return kind(text, field=details.get("field"))
