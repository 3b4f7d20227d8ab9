"""Bus keys from tokens, and the key ring of known tokens."""

from __future__ import annotations

import hashlib
import hmac

import pytest

from examlops.bus.credentials import TokenKeyring, bus_key_from_token
from examlops.core.errors import Unauthenticated

SECRET = "s" * 43
TOKEN = f"exa_0123abcd4567ef89_{SECRET}"


def test_a_tokens_bus_key_is_the_hmac_of_its_secret_and_the_bus_label() -> None:
    key_id, key = bus_key_from_token(TOKEN)
    assert key_id == "0123abcd4567ef89"
    assert key == hmac.new(SECRET.encode(), b"examlops-bus-v1", hashlib.sha256).digest()


@pytest.mark.parametrize("token", ["", "exa_short_" + SECRET, "bearer_0123abcd4567ef89_" + SECRET, TOKEN[:-10]])
def test_something_that_is_not_a_token_is_refused_without_quoting_it(token: str) -> None:
    with pytest.raises(Unauthenticated) as refused:
        bus_key_from_token(token)
    assert SECRET[:20] not in refused.value.message


def test_the_keyring_knows_its_tokens_key_ids_only() -> None:
    ring = TokenKeyring([("admin", TOKEN)])
    found = ring.bus_key("0123abcd4567ef89")
    assert found is not None and found[0].name == "admin" and not found[0].revoked
    assert found[1] == bus_key_from_token(TOKEN)[1]
    found[0].may_call(model="JPCP")  # the platform token may call everything
    assert ring.bus_key("ffffffffffffffff") is None
