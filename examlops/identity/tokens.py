"""Tokens: ``exa_<key id>_<secret>``, the secret ``secrets.token_urlsafe(32)`` (256 bits).

Only ``sha256(secret)`` is stored; a presented secret is compared with ``hmac.compare_digest``. The bus key
of a token is ``HMAC-SHA256(secret, b"examlops-bus-v1")``: the client derives it from its token, the bridge
reads it from the key's row (it cannot derive it from a hash). ``parse_token`` raises ``Unauthenticated``
for anything that is not a token's shape, with the same message as every other refusal.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass

from examlops.core.errors import Unauthenticated

PREFIX = "exa"
BUS_KEY_LABEL = b"examlops-bus-v1"
_KEY_ID = re.compile(r"[A-Za-z0-9]{8,32}")
_SECRET = re.compile(r"[A-Za-z0-9_-]{40,128}")


@dataclass(frozen=True, slots=True)
class IssuedToken:
    """A token just made: ``token`` is shown once and never stored; the rest is what the store keeps."""

    key_id: str
    token: str
    secret_sha256: str
    bus_key: bytes

    def __repr__(self) -> str:  # a token must not reach a log through a repr
        return f"IssuedToken(key_id={self.key_id!r}, token='***')"


def new_token() -> IssuedToken:
    key_id = secrets.token_hex(8)
    secret = secrets.token_urlsafe(32)
    return IssuedToken(key_id, f"{PREFIX}_{key_id}_{secret}", hash_secret(secret), derive_bus_key(secret))


def parse_token(token: str) -> tuple[str, str]:
    """``(key id, secret)`` of a token; ``Unauthenticated`` when it is not one."""
    prefix, _, rest = token.partition("_")
    key_id, _, secret = rest.partition("_")
    if prefix != PREFIX or not _KEY_ID.fullmatch(key_id) or not _SECRET.fullmatch(secret):
        raise Unauthenticated()
    return key_id, secret


def hash_secret(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def secret_matches(secret: str, stored_sha256: str) -> bool:
    return hmac.compare_digest(hash_secret(secret), stored_sha256)


def derive_bus_key(secret: str) -> bytes:
    return hmac.new(secret.encode(), BUS_KEY_LABEL, hashlib.sha256).digest()


def bus_key_from_token(token: str) -> tuple[str, bytes]:
    """The client's side of bus signing: ``(key id, bus key)`` of its token; ``Unauthenticated`` if malformed."""
    key_id, secret = parse_token(token)
    return key_id, derive_bus_key(secret)
