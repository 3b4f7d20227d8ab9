"""Login sessions: a token given once at the login form becomes an opaque session id in a cookie.

The cookie (``examlops_session``) is HttpOnly, SameSite=Strict and Path=/dashboard; it holds a random id,
never the token. The server keeps ``id -> (token, csrf token, expiry)`` in memory, so each request resolves
the token again through the identity resolver (TTL-cached there): a revoked identity loses the dashboard
within that TTL, as it loses the API. Every action form carries the session's CSRF token, compared in
constant time. A session ends at logout, after ``ttl_s`` idle, or ``max_age_s`` after its login whatever its
use; only a person's request renews the idle deadline (``get(..., renew=False)`` for a page's background
refreshes), so an open tab left alone still times out. Sessions live in this serving process only (a second
instance asks for the token again). At most ``max_sessions`` are kept: the oldest goes first.

Each confirmation page issues a one-time token bound to the action it describes (``issue_once``); the action's
POST consumes it (``consume_once``): a form sent twice (a double click, a reload of the POST) runs once. An
action's outcome is kept in the session under an id (``keep_result``) for the page the POST redirects to.
"""

from __future__ import annotations

import hmac
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

COOKIE = "examlops_session"
KEPT = 16
"""One-time tokens and action outcomes kept per session: the newest, older ones are dropped."""


@dataclass(slots=True)
class Session:
    token: str | None
    csrf: str
    expires_at: float
    ends_at: float = float("inf")
    """``max_age_s`` after the login: no use renews it."""
    once: OrderedDict[str, str] = field(default_factory=OrderedDict)
    results: OrderedDict[str, tuple[bool, str, tuple[str, ...]]] = field(default_factory=OrderedDict)

    def __repr__(self) -> str:  # the token must not reach a log through a repr
        return f"Session(token='***', expires_at={self.expires_at})"


class SessionStore:
    def __init__(
        self,
        *,
        ttl_s: float = 3600.0,
        max_age_s: float = 12 * 3600.0,
        max_sessions: int = 1000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.ttl_s = ttl_s
        self.max_age_s = max_age_s
        self.max_sessions = max_sessions
        self.clock = clock
        self._sessions: OrderedDict[str, Session] = OrderedDict()

    def open(self, token: str | None) -> tuple[str, Session]:
        """A new session for ``token`` (None: authentication is off): its id and the session."""
        session_id = secrets.token_urlsafe(32)
        now = self.clock()
        session = Session(token, secrets.token_urlsafe(32), now + self.ttl_s, now + self.max_age_s)
        self._sessions[session_id] = session
        while len(self._sessions) > self.max_sessions:
            self._sessions.popitem(last=False)
        return session_id, session

    def get(self, session_id: str | None, *, renew: bool = True) -> Session | None:
        """The live session of ``session_id``, its idle deadline renewed when ``renew`` (a person's request, not
        a page's background refresh); None when unknown, idle past ``ttl_s`` or older than ``max_age_s``."""
        if not session_id:
            return None
        session = self._sessions.get(session_id)
        now = self.clock()
        if session is None or session.expires_at <= now or session.ends_at <= now:
            self._sessions.pop(session_id, None)
            return None
        if renew:
            session.expires_at = now + self.ttl_s
            self._sessions.move_to_end(session_id)
        return session

    def close(self, session_id: str | None) -> None:
        if session_id:
            self._sessions.pop(session_id, None)


def _keep(kept: OrderedDict[str, Any], key: str, value: Any) -> None:
    kept[key] = value
    while len(kept) > KEPT:
        kept.popitem(last=False)


def issue_once(session: Session, what: str) -> str:
    """A one-time token for the action described by ``what`` (its confirmation page's form carries it)."""
    token = secrets.token_urlsafe(24)
    _keep(session.once, token, what)
    return token


def consume_once(session: Session, token: str | None, what: str) -> bool:
    """True once per token issued for ``what``; False for a token used before, unknown, or issued for another
    action (the token is spent either way)."""
    issued = session.once.pop(token, None) if token else None
    return issued is not None and hmac.compare_digest(issued.encode(), what.encode())


def keep_result(session: Session, ok: bool, message: str, warnings: tuple[str, ...] = ()) -> str:
    """An action's outcome kept for the page its POST redirects to; the id that page is asked with."""
    result_id = secrets.token_urlsafe(12)
    _keep(session.results, result_id, (ok, message, warnings))
    return result_id


def csrf_matches(session: Session, presented: str | None) -> bool:
    return presented is not None and hmac.compare_digest(session.csrf.encode(), presented.encode())
