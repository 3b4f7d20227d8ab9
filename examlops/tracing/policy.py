"""What a trace keeps of a call's input and output: the site's payload policy.

``PayloadPolicy(mode)``: ``none`` keeps nothing (''), ``hash`` keeps ``sha256:<hex>`` of the value's
canonical JSON (sorted keys, compact; equal inputs give equal hashes across processes and runs), ``full``
keeps the canonical JSON itself. A value that is not plain JSON (NaN, an object) is kept as its hash or
text of ``repr`` rather than failing the call: tracing never fails a request.
"""

from __future__ import annotations

import hashlib
from typing import Any, Literal

import orjson

from examlops.core.jsoncodec import canonical

PayloadMode = Literal["none", "hash", "full"]


class PayloadPolicy:
    """Turns a call's input or output into what its trace stores (contract above)."""

    def __init__(self, mode: PayloadMode = "none") -> None:
        self.mode = mode

    @property
    def keeps(self) -> bool:
        return self.mode != "none"

    def kept(self, value: Any) -> str:
        if self.mode == "none" or value is None:
            return ""
        text = _canonical(value)
        if self.mode == "hash":
            return "sha256:" + hashlib.sha256(text.encode()).hexdigest()
        return text

    def kept_body(self, raw: bytes) -> str:
        """``kept`` of a JSON body as it travelled; a body that is not JSON is kept as its text."""
        if self.mode == "none" or not raw:
            return ""
        try:
            value: Any = orjson.loads(raw)
        except orjson.JSONDecodeError:
            value = raw.decode("utf-8", "replace")
        return self.kept(value)


def _canonical(value: Any) -> str:
    try:
        return canonical(value)
    except (TypeError, ValueError):
        return repr(value)
