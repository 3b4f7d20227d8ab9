"""The resolver: one refusal for every bad token, a TTL cache in front of the store, exact rotation grace."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from examlops.core.errors import Unauthenticated
from examlops.identity import IdentityResolver, IdentityService, Role, bus_key_from_token
from tests.unit.identity.fakes import InMemoryIdentityStore

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


class Clocks:
    def __init__(self) -> None:
        self.mono = 0.0
        self.wall = T0

    def advance(self, seconds: float) -> None:
        self.mono += seconds
        self.wall += timedelta(seconds=seconds)


@pytest.fixture
def clocks() -> Clocks:
    return Clocks()


@pytest.fixture
def store() -> InMemoryIdentityStore:
    return InMemoryIdentityStore()


@pytest.fixture
def service(store: InMemoryIdentityStore, clocks: Clocks) -> IdentityService:
    return IdentityService(store, wall=lambda: clocks.wall)


@pytest.fixture
def resolver(store: InMemoryIdentityStore, clocks: Clocks) -> IdentityResolver:
    return IdentityResolver(store, 30.0, clock=lambda: clocks.mono, wall=lambda: clocks.wall)


def refusal(resolver: IdentityResolver, token: str | None) -> str:
    with pytest.raises(Unauthenticated) as raised:
        resolver.authenticate(token)
    return str(raised.value)


def test_a_valid_token_resolves_to_its_identity_and_key(service: IdentityService, resolver: IdentityResolver) -> None:
    identity, issued = service.add("robot-7", Role.CALLER, models=["JPCP"])
    caller = resolver.authenticate(issued.token)
    assert caller.identity == identity
    assert caller.key_id == issued.key_id


def test_missing_malformed_unknown_wrong_secret_and_revoked_tokens_get_one_message(
    service: IdentityService, resolver: IdentityResolver
) -> None:
    _, issued = service.add("robot-7", Role.CALLER)
    _, other = service.add("robot-8", Role.CALLER)
    key_id = issued.key_id
    wrong_secret = issued.token[: -len(other.token.split("_", 2)[2])] + other.token.split("_", 2)[2]
    unknown = other.token.replace(other.key_id, "f" * 16)
    messages = {refusal(resolver, t) for t in (None, "", "garbage", unknown, wrong_secret)}
    service.revoke("robot-8")
    resolver.forget()
    messages.add(refusal(resolver, other.token))
    assert messages == {str(Unauthenticated())}
    assert resolver.authenticate(issued.token).key_id == key_id


def test_a_revocation_takes_effect_within_the_ttl_and_not_before_the_cache_expires(
    service: IdentityService, resolver: IdentityResolver, store: InMemoryIdentityStore, clocks: Clocks
) -> None:
    _, issued = service.add("robot-7", Role.CALLER)
    resolver.authenticate(issued.token)
    reads = store.key_reads
    service.revoke("robot-7")
    clocks.advance(29.0)
    resolver.authenticate(issued.token)  # still cached: the store is not read on every request
    assert store.key_reads == reads
    clocks.advance(1.5)
    refusal(resolver, issued.token)
    assert store.key_reads == reads + 1


def test_the_memory_only_path_answers_a_verified_token_until_its_ttl_or_grace_ends_and_nothing_else(
    service: IdentityService, resolver: IdentityResolver, store: InMemoryIdentityStore, clocks: Clocks
) -> None:
    _, old = service.add("console", Role.OPERATOR)
    assert resolver.cached(old.token) is None  # never verified: authenticate decides
    assert resolver.cached(None) is None and resolver.cached("exa_nope_nope") is None
    caller = resolver.authenticate(old.token)
    reads = store.key_reads
    assert resolver.cached(old.token) == caller
    assert resolver.cached(old.token + "x") is None  # another string, however close
    service.rotate("console", grace_s=40)
    clocks.advance(20)
    assert resolver.cached(old.token) == caller  # within the TTL: memory only, as authenticate would
    assert store.key_reads == reads
    resolver.forget()
    resolver.authenticate(old.token)  # now knows the key's grace deadline
    clocks.advance(19)
    assert resolver.cached(old.token) == caller
    clocks.advance(1)  # the deadline holds exactly on the memory-only path too
    assert resolver.cached(old.token) is None
    refusal(resolver, old.token)


def test_rotation_keeps_the_old_token_until_the_grace_deadline_exactly(
    service: IdentityService, resolver: IdentityResolver, clocks: Clocks
) -> None:
    _, old = service.add("console", Role.OPERATOR)
    new, deadline = service.rotate("console", grace_s=3600)
    assert deadline == clocks.wall + timedelta(hours=1)
    assert resolver.authenticate(old.token).name == resolver.authenticate(new.token).name == "console"
    clocks.advance(3599)
    resolver.forget()
    resolver.authenticate(old.token)
    clocks.advance(1)  # the deadline is checked on every call, cached or not
    refusal(resolver, old.token)
    assert resolver.authenticate(new.token).name == "console"


def test_a_second_rotation_shortens_an_older_grace_but_never_extends_it(
    service: IdentityService, resolver: IdentityResolver, store: InMemoryIdentityStore, clocks: Clocks
) -> None:
    _, first = service.add("console", Role.OPERATOR)
    service.rotate("console", grace_s=3600)
    service.rotate("console", grace_s=0)
    resolver.forget()
    refusal(resolver, first.token)
    ends = [k.not_after for k in store.keys("console")]
    assert ends[0] == ends[1] == clocks.wall and ends[2] is None


def test_the_bus_key_of_a_key_id_matches_the_clients_derivation_and_its_caller_is_revoked_within_the_ttl(
    service: IdentityService, resolver: IdentityResolver, clocks: Clocks
) -> None:
    _, issued = service.add("robot-7", Role.CALLER, tasks=["t"])
    key_id, key = bus_key_from_token(issued.token)
    found = resolver.bus_key(key_id)
    assert found is not None and found[1] == key and found[0].name == "robot-7" and not found[0].revoked
    assert resolver.bus_key("f" * 16) is None
    service.revoke("robot-7")
    clocks.advance(31)
    revoked = resolver.bus_key(key_id)  # still known (its jobs are authentic), answered `unauthenticated`
    assert revoked is not None and revoked[0].revoked and revoked[1] == key


def test_random_unknown_key_ids_cannot_grow_the_cache_past_its_bound(
    store: InMemoryIdentityStore, clocks: Clocks
) -> None:
    resolver = IdentityResolver(store, 30.0, clock=lambda: clocks.mono, wall=lambda: clocks.wall, max_entries=10)
    for i in range(100):
        assert resolver.bus_key(f"{i:016x}") is None
    assert len(resolver._cache) <= 10
