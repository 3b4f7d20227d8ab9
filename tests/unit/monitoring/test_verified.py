"""The stored verify result's carried findings: a run that could not read the registry keeps what one that
could found, and never its chain break (each walk judges the chain itself)."""

from __future__ import annotations

from examlops.monitoring.audit.verified import NOT_RECHECKED, UNREADABLE_BY, VerifyRecord, carried_findings

MOVED = "JPCP Production: at 3, the trail's last move left it at 2 (moved outside examlops?)"


def record(*problems: str, by: str = "exa audit verify") -> VerifyRecord:
    return VerifyRecord(1.0, by, not problems, 10, 10, 1, problems)


def test_an_alias_finding_is_carried_and_marked_once() -> None:
    previous = record("seq 4 (hash): the link does not match", MOVED)
    carried = carried_findings(previous)
    assert carried == (f"{MOVED} {NOT_RECHECKED}",)  # the chain break is not carried
    assert carried_findings(record(*carried)) == carried  # carried again, not marked twice


def test_nothing_is_carried_from_an_ok_an_unreadable_or_no_result() -> None:
    assert carried_findings(None) == ()
    assert carried_findings(record()) == ()
    assert carried_findings(record("the stored verify result cannot be read", by=UNREADABLE_BY)) == ()
