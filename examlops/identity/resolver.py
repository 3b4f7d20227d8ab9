"""From a presented token (HTTP) or key id (bus) to the ``Caller`` it acts as, cached for ``ttl_s``.

``authenticate(token)`` returns the ``Caller`` or raises ``Unauthenticated`` with one message for a
missing, malformed, unknown, revoked or expired token; ``StoreUnavailable`` when the store cannot be read
on a cache miss. ``bus_key(key_id)`` gives the bridge ``(Caller, bus key)`` for a key id, or None when the
key is unknown, revoked or past its ``not_after``.

What the store says about a key id (found or not) is cached for ``ttl_s`` seconds of ``clock``: a
revocation, a rotation's end of grace or a new identity takes effect within that TTL. Validity against
``not_after`` is checked on every call with ``wall``, so a grace deadline is exact. The cache holds at most
``max_entries`` key ids (random unknown ids cannot grow it without bound). A token that verified is
remembered for the same TTL, so a known caller's next request skips parsing and hashing its token; only
tokens that verified are kept, in this process's memory, where the request held them anyway.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime

from examlops.core.errors import Unauthenticated
from examlops.identity.model import Caller, Identity, IdentityKey
from examlops.identity.ports import IdentityStore
from examlops.identity.tokens import parse_token, secret_matches

_Entry = tuple[float, tuple[Identity, IdentityKey] | None]


def _utc_now() -> datetime:
    return datetime.now(UTC)


class IdentityResolver:
    """The per-process, TTL-cached view of the identity store (contract above). Thread-safe enough: a race
    between two misses reads the store twice and keeps either answer."""

    def __init__(
        self,
        store: IdentityStore,
        ttl_s: float,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], datetime] = _utc_now,
        max_entries: int = 10_000,
    ) -> None:
        self._store = store
        self._ttl_s = ttl_s
        self._clock = clock
        self._wall = wall
        self._max = max_entries
        self._cache: dict[str, _Entry] = {}
        self._verified: dict[str, tuple[float, Identity, IdentityKey, Caller]] = {}

    def cached(self, token: str | None) -> Caller | None:
        """The caller of ``token`` when it verified within the TTL and is valid now, from memory alone (no
        store, no parsing, no hashing: every request of a known caller); None when ``authenticate`` must
        decide."""
        known = self._verified.get(token) if token else None
        if known is None or known[0] <= self._clock():
            return None
        _, identity, key, caller = known
        return caller if self._valid(identity, key) else None

    def is_fresh(self, token: str | None) -> bool:
        """True when ``authenticate(token)`` will not read the store (so async callers may skip a thread)."""
        known = self._verified.get(token) if token else None
        if known is not None:
            return known[0] > self._clock()
        try:
            key_id, _ = parse_token(token or "")
        except Unauthenticated:
            return True
        entry = self._cache.get(key_id)
        return entry is not None and entry[0] > self._clock()

    def authenticate(self, token: str | None) -> Caller:
        if not token:
            raise Unauthenticated()
        now = self._clock()
        known = self._verified.get(token)
        if known is not None and known[0] > now:
            _, identity, key, caller = known
        else:
            key_id, secret = parse_token(token)
            found = self._lookup(key_id)
            if found is None:
                raise Unauthenticated()
            identity, key = found
            if not secret_matches(secret, key.secret_sha256):
                raise Unauthenticated()
            caller = Caller(identity, key_id)
            if len(self._verified) >= self._max:
                self._verified.clear()
            self._verified[token] = (self._cache[key_id][0] if key_id in self._cache else now, identity, key, caller)
        if not self._valid(identity, key):
            raise Unauthenticated()
        return caller

    def is_cached(self, key_id: str) -> bool:
        """True when ``bus_key(key_id)`` will not read the store (so the bridge may skip a thread)."""
        entry = self._cache.get(key_id)
        return entry is not None and entry[0] > self._clock()

    def bus_key(self, key_id: str) -> tuple[Caller, bytes] | None:
        """``(Caller, bus key)`` of a known key id, None for an unknown one. The caller of a revoked identity
        or an expired key is ``revoked``: a job it signed is authentic, and is answered ``unauthenticated``."""
        found = self._lookup(key_id)
        if found is None:
            return None
        identity, key = found
        return Caller(identity, key_id, revoked=not self._valid(identity, key)), key.bus_key

    def forget(self, key_id: str | None = None) -> None:
        """Drop one cached key id, or all of them."""
        if key_id is None:
            self._cache.clear()
            self._verified.clear()
        else:
            self._cache.pop(key_id, None)
            for token in [t for t, (_, _, key, _) in self._verified.items() if key.key_id == key_id]:
                del self._verified[token]

    def _valid(self, identity: Identity, key: IdentityKey) -> bool:
        # A key with no end is valid whenever its identity is: no clock read on the hot path.
        return identity.revoked is None and (key.not_after is None or key.valid_at(self._wall()))

    def _lookup(self, key_id: str) -> tuple[Identity, IdentityKey] | None:
        now = self._clock()
        entry = self._cache.get(key_id)
        if entry is not None and entry[0] > now:
            return entry[1]
        found = self._store.key(key_id)
        if len(self._cache) >= self._max:
            self._evict(now)
        self._cache[key_id] = (now + self._ttl_s, found)
        return found

    def _evict(self, now: float) -> None:
        for stale in [k for k, (expires, _) in self._cache.items() if expires <= now]:
            del self._cache[stale]
        while len(self._cache) >= self._max:
            del self._cache[next(iter(self._cache))]
