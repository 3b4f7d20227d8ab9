"""Ask serving instances to reload a model, then confirm each serves the version an alias points at.

``confirm_reload(urls, model, alias, version, timeout_s=..., connect_timeout_s=...)`` works on every
instance at once (one thread and one HTTP client each) and returns one ``InstanceReport`` per URL,
in the order given; it never raises for an instance. For each instance:

1. ``POST {url}/admin/reload {"model": model}``. A reply that says the instance refused the version
   (it failed to load there) or could not reach the registry ends that instance at once: it would
   not converge by waiting.
2. ``GET {url}/v1/models`` every ``POLL_S`` until its row (model, alias) reports ``version``.

One deadline, ``timeout_s`` after the call, bounds everything, requests included (connecting is
bounded by ``connect_timeout_s`` too). httpx errors are translated here into a line of text in the
report ("cannot be reached: ...", "did not answer within ..."). ``transport`` lets tests fake the
network at httpx's seam; ``token`` is sent as ``Authorization: Bearer`` (it needs the ``reload``
permission).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import httpx

POLL_S = 0.2


@dataclass(frozen=True, slots=True)
class InstanceReport:
    """What one instance said: ``confirmed`` when it serves the version; ``detail`` says what it reported."""

    url: str
    confirmed: bool
    detail: str


def confirm_reload(
    urls: Sequence[str],
    model: str,
    alias: str,
    version: str,
    *,
    timeout_s: float,
    connect_timeout_s: float = 5.0,
    transport: httpx.BaseTransport | None = None,
    token: str | None = None,
) -> list[InstanceReport]:
    """Reload ``model`` on every instance and wait until each serves ``version`` for ``alias`` (contract above)."""
    deadline = time.monotonic() + timeout_s

    def one(url: str) -> InstanceReport:
        headers = {"Authorization": f"Bearer {token}"} if token else None
        with httpx.Client(base_url=url.rstrip("/"), transport=transport, headers=headers) as client:
            return _confirm(client, url, model, alias, version, deadline, timeout_s, connect_timeout_s)

    if not urls:
        return []
    with ThreadPoolExecutor(max_workers=len(urls), thread_name_prefix="confirm-reload") as pool:
        return list(pool.map(one, urls))


def _confirm(
    client: httpx.Client,
    url: str,
    model: str,
    alias: str,
    version: str,
    deadline: float,
    timeout_s: float,
    connect_timeout_s: float,
) -> InstanceReport:
    def timeout() -> httpx.Timeout:
        left = max(0.1, deadline - time.monotonic())
        return httpx.Timeout(left, connect=min(left, connect_timeout_s))

    try:
        reply = client.post("/admin/reload", json={"model": model}, timeout=timeout())
        if reply.status_code != 200:
            return InstanceReport(url, False, f"reload answered HTTP {reply.status_code}: {_error_of(reply)}")
        for change in reply.json().get("changes", []):
            if str(change.get("alias", "")).lower() != alias.lower():
                continue
            if change.get("outcome") == "refused":
                return InstanceReport(url, False, f"refused version {version}: {change.get('reason')}")
            if change.get("outcome") == "unreachable":
                return InstanceReport(url, False, f"cannot reach the registry: {change.get('reason')}")
        while True:
            seen = _row(client.get("/v1/models", timeout=timeout()), model, alias)
            if seen is not None and seen.get("version") == version:
                return InstanceReport(url, True, f"serves version {version}")
            if time.monotonic() >= deadline:
                return InstanceReport(url, False, f"{_describe(seen, alias)} after {timeout_s:g} s")
            time.sleep(POLL_S)
    except httpx.TimeoutException:
        return InstanceReport(url, False, f"did not answer within {timeout_s:g} s")
    except httpx.TransportError as exc:
        return InstanceReport(url, False, f"cannot be reached ({type(exc).__name__}: {exc})")
    except ValueError as exc:  # a body that is not the JSON serving sends
        return InstanceReport(url, False, f"answered something that is not examlops serving ({exc})")


def _row(reply: httpx.Response, model: str, alias: str) -> dict[str, Any] | None:
    if reply.status_code != 200:
        raise ValueError(f"GET /v1/models answered HTTP {reply.status_code}")
    rows = reply.json()
    if not isinstance(rows, list):
        raise ValueError("GET /v1/models did not answer a list")
    for row in rows:
        if str(row.get("model", "")).lower() == model.lower() and str(row.get("alias") or "").lower() == alias.lower():
            return dict(row)
    return None


def _describe(row: dict[str, Any] | None, alias: str) -> str:
    if row is None:
        return f"does not serve the alias {alias}"
    text = f"still reports version {row.get('version')} ({row.get('state')})"
    return f"{text}: {row['reason']}" if row.get("reason") else text


def _error_of(reply: httpx.Response) -> str:
    try:
        body = reply.json()
    except ValueError:
        return reply.text[:200]
    return str(body.get("error", body))[:200] if isinstance(body, dict) else str(body)[:200]
