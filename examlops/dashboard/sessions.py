"""Login sessions: a token given once at the login form becomes an opaque session id in a cookie.

The cookie (``examlops_session``) is HttpOnly, SameSite=Strict and Path=/dashboard; it holds a random id,
never the token. The server keeps ``id -> (token, csrf token, expiry)`` in memory, so each request resolves
the token again through the identity resolver (TTL-cached there): a revoked identity loses the dashboard
within that TTL, as it loses the API. Every action form carries the session's CSRF token, compared in
constant time. A session ends at logout or after ``ttl_s`` idle; sessions live in this serving process only
(a second instance asks for the token again). At most ``max_sessions`` are kept: the oldest goes first.
"""

from __future__ import annotations

import hmac
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

COOKIE = "examlops_session"


@dataclass(slots=True)
class Session:
    token: str | None
    csrf: str
    expires_at: float

    def __repr__(self) -> str:  # the token must not reach a log through a repr
        return f"Session(token='***', expires_at={self.expires_at})"


class SessionStore:
    def __init__(
        self, *, ttl_s: float = 8 * 3600.0, max_sessions: int = 1000, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.ttl_s = ttl_s
        self.max_sessions = max_sessions
        self.clock = clock
        self._sessions: OrderedDict[str, Session] = OrderedDict()

    def open(self, token: str | None) -> tuple[str, Session]:
        """A new session for ``token`` (None: authentication is off): its id and the session."""
        session_id = secrets.token_urlsafe(32)
        session = Session(token, secrets.token_urlsafe(32), self.clock() + self.ttl_s)
        self._sessions[session_id] = session
        while len(self._sessions) > self.max_sessions:
            self._sessions.popitem(last=False)
        return session_id, session

    def get(self, session_id: str | None) -> Session | None:
        """The live session of ``session_id``, its idle deadline renewed; None when unknown or expired."""
        if not session_id:
            return None
        session = self._sessions.get(session_id)
        now = self.clock()
        if session is None or session.expires_at <= now:
            self._sessions.pop(session_id, None)
            return None
        session.expires_at = now + self.ttl_s
        self._sessions.move_to_end(session_id)
        return session

    def close(self, session_id: str | None) -> None:
        if session_id:
            self._sessions.pop(session_id, None)


def csrf_matches(session: Session, presented: str | None) -> bool:
    return presented is not None and hmac.compare_digest(session.csrf.encode(), presented.encode())
