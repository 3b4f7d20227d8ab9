"""The HMAC both bus entries are signed with: a job (``wire``) and a reply (``replies``).

``sign`` is HMAC-SHA256 with an identity's bus key over the ASCII JSON array of the items
(``jsoncodec.ascii_array``), in hex. ``matches`` compares a signature with what a message claims in
constant time; anything but a str of ASCII (a forged field Redis hands back as any text) is no match,
never an error. Pure: no redis, no I/O.
"""

from __future__ import annotations

import hashlib
import hmac

from examlops.core.jsoncodec import ascii_array


def matches(expected: str, given: object) -> bool:
    """Whether ``given`` is the signature ``expected``, compared in constant time (module docstring)."""
    return isinstance(given, str) and given.isascii() and hmac.compare_digest(expected, given)


def sign(key: bytes, items: list[str | int]) -> str:
    """HMAC-SHA256 over the ASCII JSON array of ``items`` (``jsoncodec.ascii_array``), in hex."""
    return hmac.new(key, ascii_array(items), hashlib.sha256).hexdigest()
