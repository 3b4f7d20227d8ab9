"""Alias moves whose registry writes fail part-way: a rollback still goes where the alias last came from."""

from __future__ import annotations

import contextlib
import itertools

import pytest

from examlops.core.errors import RegistryUnavailable, VersionNotFound
from examlops.promotion.aliases import move_alias, plan_rollback, rollback_alias
from tests.unit.promotion.fakes import AliasWrite, ScriptedRegistry

Step = tuple[str, AliasWrite]
"""A promotion to a version ("3") or a rollback ("rollback"), and how its alias write ends."""


def _history_1_2_1() -> ScriptedRegistry:
    """Production went 1 -> 2 -> 1 cleanly."""
    registry = ScriptedRegistry()
    move_alias(registry, "AC", "Production", version=2)
    move_alias(registry, "AC", "Production", version=1)
    return registry


def _run(registry: ScriptedRegistry, step: str, alias_write: AliasWrite) -> None:
    """``step``, its alias write (if it comes to one) ending as ``alias_write`` says."""
    registry.script = [alias_write]
    try:
        if step == "rollback":
            rollback_alias(registry, "AC", "Production")
        else:
            move_alias(registry, "AC", "Production", version=step)
    except RegistryUnavailable:
        pass


@pytest.mark.parametrize("then", ["4", "rollback"])
def test_a_move_whose_reply_was_lost_is_still_undone_after_a_refused_move(then: str) -> None:
    """1 -> 2 -> 1, "promote 3" applied with its reply lost, then a promotion to 4 or a rollback refused at
    the alias write: the alias is at 3 and a rollback goes to 1, where it came from (not 2)."""
    registry = _history_1_2_1()
    _run(registry, "3", "lost")
    _run(registry, then, "refused")
    back = plan_rollback(registry, "AC", "Production")
    assert registry.aliases["Production"] == "3"
    assert (back.old_version, back.new_version) == ("3", "1")


def test_every_three_steps_of_moves_lost_or_refused_leave_a_rollback_to_where_the_alias_came_from() -> None:
    """After 1 -> 2 -> 1, any three steps (a promotion to 1..4 or a rollback; each alias write applied,
    applied with its reply lost, or refused): a rollback goes to the version the alias had before it last
    changed."""
    steps: list[Step] = [
        (what, outcome) for what in ("1", "2", "3", "4", "rollback") for outcome in ("ok", "lost", "refused")
    ]
    wrong = []
    for sequence in itertools.product(steps, repeat=3):
        registry = _history_1_2_1()
        came_from = "2"
        for what, alias_write in sequence:
            before = registry.aliases["Production"]
            with contextlib.suppress(VersionNotFound):  # a rollback with nothing recorded
                _run(registry, what, alias_write)
            if registry.aliases["Production"] != before:
                came_from = before
        back = plan_rollback(registry, "AC", "Production")
        if back.new_version != came_from:
            wrong.append((sequence, back.new_version, came_from))
    assert wrong == []
