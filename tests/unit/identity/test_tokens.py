from __future__ import annotations

import hashlib
import hmac

import pytest

from examlops.core.errors import Unauthenticated
from examlops.identity import bus_key_from_token, parse_token
from examlops.identity.tokens import new_token, secret_matches


def test_a_token_carries_its_key_id_and_a_256_bit_secret_of_which_only_the_hash_is_kept() -> None:
    issued = new_token()
    key_id, secret = parse_token(issued.token)
    assert issued.token == f"exa_{key_id}_{secret}"
    assert key_id == issued.key_id
    assert len(secret) >= 43  # token_urlsafe(32): 32 random bytes
    assert issued.secret_sha256 == hashlib.sha256(secret.encode()).hexdigest()
    assert secret not in repr(issued) and issued.token not in repr(issued)


def test_two_tokens_never_share_a_key_id_or_secret() -> None:
    tokens = {new_token().token for _ in range(200)}
    assert len(tokens) == 200
    assert len({parse_token(t)[0] for t in tokens}) == 200


@pytest.mark.parametrize(
    "token",
    [
        "",
        "exa",
        "Bearer x",
        "exa__abc",
        "abc_0123456789abcdef_" + "a" * 43,
        "exa_0123456789abcdef_short",
        "exa_!!_" + "a" * 43,
    ],
)
def test_a_malformed_token_is_unauthenticated_with_the_common_message(token: str) -> None:
    with pytest.raises(Unauthenticated) as raised:
        parse_token(token)
    assert str(raised.value) == str(Unauthenticated())


def test_the_secret_is_checked_against_its_hash() -> None:
    issued = new_token()
    _, secret = parse_token(issued.token)
    assert secret_matches(secret, issued.secret_sha256)
    assert not secret_matches(secret[:-1] + ("A" if secret[-1] != "A" else "B"), issued.secret_sha256)


def test_the_client_derives_the_same_bus_key_the_store_keeps() -> None:
    issued = new_token()
    key_id, key = bus_key_from_token(issued.token)
    _, secret = parse_token(issued.token)
    assert key_id == issued.key_id
    assert key == issued.bus_key == hmac.new(secret.encode(), b"examlops-bus-v1", hashlib.sha256).digest()
