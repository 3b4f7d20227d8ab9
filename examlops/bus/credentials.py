"""Bus keys from tokens: the client's side of job signing, and a fixed key ring for one known token.

A token is ``exa_<key id>_<secret>``; its bus key is HMAC-SHA256(secret, ``examlops-bus-v1``), the same
derivation the identity store keeps for each key (so the bridge never sees a token, only key ids and keys).

``TokenKeyring`` implements ``ports.BusKeys`` for the tokens it is given, each acting as an identity that
may call everything: what a bridge verifies with until the identity store's resolver is wired in
``bootstrap`` (then every identity's own keys and permissions apply).
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Iterable
from dataclasses import dataclass

from examlops.core.errors import Unauthenticated

BUS_KEY_LABEL = b"examlops-bus-v1"
_TOKEN = re.compile(r"exa_([A-Za-z0-9]{8,32})_([A-Za-z0-9_-]{40,128})")


def bus_key_from_token(token: str) -> tuple[str, bytes]:
    """``(key id, bus key)`` of a token; ``Unauthenticated`` (which never quotes the token) when it is not one."""
    match = _TOKEN.fullmatch(token.strip())
    if match is None:
        raise Unauthenticated("the token is not an examlops token (exa_<key id>_<secret>)")
    key_id, secret = match.groups()
    return key_id, hmac.new(secret.encode(), BUS_KEY_LABEL, hashlib.sha256).digest()


@dataclass(frozen=True, slots=True)
class TokenCaller:
    """The identity of a token in a ``TokenKeyring``: never revoked, may call every task and model."""

    name: str
    revoked: bool = False

    def may_call(self, *, task: str | None = None, model: str | None = None) -> None:
        return None


class TokenKeyring:
    """``ports.BusKeys`` over ``(identity name, token)`` pairs known to this process."""

    def __init__(self, tokens: Iterable[tuple[str, str]]) -> None:
        self._keys: dict[str, tuple[TokenCaller, bytes]] = {}
        for name, token in tokens:
            key_id, key = bus_key_from_token(token)
            self._keys[key_id] = (TokenCaller(name), key)

    def bus_key(self, key_id: str) -> tuple[TokenCaller, bytes] | None:
        return self._keys.get(key_id)
