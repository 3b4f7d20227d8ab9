"""`exa audit verify`'s alias check reads the last move of each alias from the verified chain, not from an index."""

from __future__ import annotations

from examlops.bootstrap.moves import LastMoves
from examlops.monitoring.audit import ALIAS_MOVE_FAILED, ALIAS_MOVE_INTENDED, ALIAS_MOVED
from examlops.monitoring.audit.verify import verify
from examlops.promotion.trail import AuditedMove
from tests.unit.monitoring.audit_fakes import SECRET, InMemoryAuditStore


def _move(store: InMemoryAuditStore, type: str, old: str, new: str, alias: str = "Production") -> None:
    data = {"model": "JPCP", "alias": alias, "old_version": old, "new_version": new, "from": old, "to": new}
    store.add(type, "JPCP", {**data, "actor": "admin", **({"error": "boom"} if type == ALIAS_MOVE_FAILED else {})})


def test_the_audit_alias_check_takes_the_last_event_of_each_alias_from_the_verified_chain() -> None:
    store = InMemoryAuditStore()
    _move(store, ALIAS_MOVE_INTENDED, "1", "2")
    _move(store, ALIAS_MOVED, "1", "2")
    store.add("inference.served", "JPCP", {"job_id": "j"})
    _move(store, ALIAS_MOVE_INTENDED, "2", "3", alias="Canary")
    _move(store, ALIAS_MOVE_FAILED, "2", "3", alias="Canary")
    last = LastMoves()
    assert verify(store, SECRET, None, seen=last).ok
    assert sorted(last.moves(), key=lambda m: m.alias) == [
        AuditedMove("failed", "JPCP", "Canary", "2", "3", "admin", "boom"),
        AuditedMove("moved", "JPCP", "Production", "1", "2", "admin"),
    ]


def test_the_audit_alias_check_trusts_no_event_past_a_broken_link() -> None:
    store = InMemoryAuditStore()
    _move(store, ALIAS_MOVE_INTENDED, "1", "2")
    _move(store, ALIAS_MOVED, "1", "2")
    entry_id, fields = store.stream[1]
    store.stream[1] = (entry_id, {**fields, "data": fields["data"].replace('"to":"2"', '"to":"9"')})  # edited
    last = LastMoves()
    report = verify(store, SECRET, None, seen=last)
    assert report.broken is not None and report.broken.kind == "edited"
    assert [m.state for m in last.moves()] == ["intended"]  # the edited outcome is not taken as the last word
