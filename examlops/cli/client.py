"""A small HTTP client for the serving API, used by `exa serve ...` and `exa predict`.

httpx errors are translated here: an unreachable server is ``PipelineUnavailable``
(exit 3), and an error reply becomes the error its ``code`` names.
"""

from __future__ import annotations

from typing import Any, BinaryIO, NoReturn

import httpx

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
        try:
            body = response.json()
        except ValueError:
            body = {"error": response.text[:200]}
        if response.status_code in ok:
            return body
        self._raise(response, path, body)

    def _raise(self, response: httpx.Response, path: str, body: Any = None) -> NoReturn:
        """The error an error reply's status and ``code`` name."""
        if body is None:
            try:
                body = response.json()
            except ValueError:
                body = {"error": response.text[:200]}
        message = body.get("error") if isinstance(body, dict) else None
        text = message or f"HTTP {response.status_code} from {path}"
        if response.status_code == 401:
            raise errors.Unauthenticated(f"{text} (set EXAMLOPS_TOKEN, or run `exa up` for the admin token)")
        if response.status_code == 403:
            raise errors.Forbidden(text, permission=str((body or {}).get("permission") or ""))
        kind = _BY_STATUS.get(response.status_code, errors.InferenceFailed)
        raise kind(text, field=(body or {}).get("field"))

    def get(self, path: str, *, ok: tuple[int, ...] = (200,)) -> Any:
        return self.request("GET", path, ok=ok)

    def download(self, path: str, sink: BinaryIO) -> int:
        """Stream a 200 reply's body into ``sink``; the bytes written. Errors as ``request``."""
        try:
            with self._http.stream("GET", path) as response:
                if response.status_code != 200:
                    response.read()
                    self._raise(response, path)
                written = 0
                for chunk in response.iter_bytes():
                    sink.write(chunk)
                    written += len(chunk)
                return written
        except httpx.TransportError as exc:
            raise errors.PipelineUnavailable(f"serving at {self.base_url} cannot be reached ({exc})") from exc
