from __future__ import annotations

import pytest

from examlops.core.errors import Forbidden
from examlops.identity import ROLE_PERMISSIONS, Caller, Identity, Permission, Role, parse_role


def test_roles_bundle_their_permissions() -> None:
    assert ROLE_PERMISSIONS[Role.CALLER] == {Permission.CALL}
    assert ROLE_PERMISSIONS[Role.OPERATOR] == set(Permission) - {Permission.MANAGE_IDENTITIES, Permission.RELAY}
    assert ROLE_PERMISSIONS[Role.BRIDGE] == {Permission.CALL, Permission.RELAY}
    assert ROLE_PERMISSIONS[Role.ADMIN] == set(Permission)


def test_a_missing_permission_is_forbidden_naming_it() -> None:
    caller = Caller(Identity("robot-7", Role.CALLER))
    caller.require(Permission.CALL)
    with pytest.raises(Forbidden) as raised:
        caller.require(Permission.SET_TRAFFIC)
    assert raised.value.permission == "set_traffic"
    assert "set_traffic" in str(raised.value)


def test_task_and_model_lists_narrow_call_case_insensitively_and_empty_means_all() -> None:
    narrow = Caller(Identity("robot-7", Role.CALLER, tasks=("pavement.distress.jpcp",), models=("JPCP",)))
    narrow.may_call(model="jpcp")
    narrow.may_call(task="PAVEMENT.distress.jpcp", model="JPCP")
    with pytest.raises(Forbidden, match="model 'AC'"):
        narrow.may_call(model="AC")
    with pytest.raises(Forbidden, match="task 'other'"):
        narrow.may_call(task="other")
    Caller(Identity("app", Role.CALLER)).may_call(task="anything", model="AC")


def test_an_unknown_role_is_refused_naming_the_roles() -> None:
    assert parse_role(" Operator ") is Role.OPERATOR
    with pytest.raises(ValueError, match="caller, operator, admin"):
        parse_role("root")


def test_an_identity_narrowed_to_tasks_calls_by_task_only_unless_it_also_names_models() -> None:
    by_task = Caller(Identity("robot-7", Role.CALLER, tasks=("pavement.distress.jpcp",)))
    by_task.may_call(task="Pavement.Distress.JPCP", model="JPCP")
    with pytest.raises(Forbidden, match="its tasks only") as raised:
        by_task.may_call(model="JPCP")
    assert raised.value.permission == "call"
    both = Caller(Identity("robot-8", Role.CALLER, tasks=("pavement.distress.jpcp",), models=("JPCP",)))
    both.may_call(model="jpcp")
    with pytest.raises(Forbidden):
        both.may_call(model="CRCP")
