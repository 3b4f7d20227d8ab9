"""The dashboard's HTTP manners: the headers of its pages and of the Evidently reports it hands out, where a
request without a session goes, the same-origin check of its form posts, and reading a form.

Contracts: pages carry a Content-Security-Policy that runs only the dashboard's own scripts; a report is
sandboxed (its scripts run in an origin of their own, away from the session and CSRF tokens). A form post
whose ``Origin`` names another site is refused by the routes (``same_origin``).
"""

from __future__ import annotations

from urllib.parse import parse_qs, urlsplit

from fastapi import Request
from fastapi.responses import RedirectResponse, Response

REPORT_HEADERS = {
    # Evidently's HTML runs its own scripts: sandboxed, it runs them in an origin of its own, away from the
    # dashboard's session and CSRF tokens.
    "Content-Security-Policy": "sandbox allow-scripts",
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-store",
}
HEADERS = {
    "Content-Security-Policy": "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data:; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-store",
}


def to_login(request: Request, to: str) -> Response:
    """Where a request without a live session goes: a page to the login; an htmx refresh (its target is a
    panel, not the page) a 401 that tells htmx to load the login as a whole page (``HX-Redirect``)."""
    if request.headers.get("HX-Request") == "true":
        return Response("log in again", status_code=401, headers={"HX-Redirect": to})
    return RedirectResponse(to, status_code=303)


def same_origin(request: Request) -> bool:
    """A form post from the dashboard's own pages: its ``Origin`` (sent by browsers on every POST) names this
    host, or it sends none (a client that is not a browser cannot be made to post by another site)."""
    origin = request.headers.get("origin")
    if origin is None:
        return True
    return urlsplit(origin).netloc == request.headers.get("host", request.url.netloc)


async def read_form(request: Request) -> dict[str, str]:
    """A urlencoded form body (the dashboard posts no files), first value of each field."""
    body = (await request.body()).decode("utf-8", errors="replace")
    return {key: values[0] for key, values in parse_qs(body, keep_blank_values=True).items()}
