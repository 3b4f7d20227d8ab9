from __future__ import annotations

import pytest

from examlops.core.errors import Conflict, InvalidInput, NotFound
from examlops.identity import IdentityService, Role
from tests.unit.identity.fakes import InMemoryIdentityStore


@pytest.fixture
def service() -> IdentityService:
    return IdentityService(InMemoryIdentityStore())


def test_the_store_never_holds_the_token_or_its_secret(service: IdentityService) -> None:
    _, issued = service.add("robot-7", Role.CALLER)
    secret = issued.token.split("_", 2)[2]
    ((identity, keys),) = service.identities()
    assert secret not in repr((identity, keys))
    assert keys[0].secret_sha256 != secret


@pytest.mark.parametrize("name", ["", "-x", "a b", "x" * 65, "system:bridge", "ü"])
def test_a_bad_name_is_invalid_input(service: IdentityService, name: str) -> None:
    with pytest.raises(InvalidInput):
        service.add(name, Role.CALLER)


def test_a_taken_name_is_a_conflict_and_an_unknown_one_not_found(service: IdentityService) -> None:
    service.add("robot-7", Role.CALLER)
    with pytest.raises(Conflict):
        service.add("robot-7", Role.ADMIN)
    with pytest.raises(NotFound):
        service.revoke("nobody")
    with pytest.raises(NotFound):
        service.rotate("nobody", 60)


def test_a_revoked_identity_cannot_be_rotated_back_to_life(service: IdentityService) -> None:
    service.add("robot-7", Role.CALLER)
    service.revoke("robot-7")
    with pytest.raises(Conflict, match="revoked"):
        service.rotate("robot-7", 60)


def test_the_first_admin_is_created_once(service: IdentityService) -> None:
    issued = service.ensure_admin()
    assert issued is not None
    assert service.ensure_admin() is None
    ((admin, _),) = service.identities()
    assert admin.name == "admin" and admin.role is Role.ADMIN


def test_duplicate_and_blank_list_entries_are_dropped(service: IdentityService) -> None:
    identity, _ = service.add("app", Role.CALLER, tasks=["a", " a", "", "b"], models=["JPCP", "JPCP"])
    assert identity.tasks == ("a", "b") and identity.models == ("JPCP",)
