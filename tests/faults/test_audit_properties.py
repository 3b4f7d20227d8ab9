"""Property tests (hypothesis) of the audit verifier: every tampering of a chain is caught, an intact one passes.

The chain is built in memory (``verify`` reads any ``ChainSource``) with signed
checkpoints at random seqs; each example applies one tampering an attacker with
write access to Redis could do, and ``verify`` must name a broken link:
an edited field, a deleted event, two events swapped, a truncated tail, a
suffix rewritten with recomputed hashes (head moved too), a rollback to an
older copy, a forged checkpoint.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime

from hypothesis import given, settings
from hypothesis import strategies as st

from examlops.monitoring.audit import GENESIS, AuditCheckpoint, AuditEvent, verify
from examlops.monitoring.audit.checkpoints import sign_checkpoint
from examlops.monitoring.audit.store import Watermark

SECRET = b"s" * 32
PROFILE = settings(max_examples=150, deadline=None)


@dataclass
class MemoryChain:
    """A ``ChainSource`` in memory: the stream's entries and the head."""

    events: list[AuditEvent]
    head_at: tuple[int, str] = (0, GENESIS)

    def head(self) -> tuple[int, str]:
        return self.head_at

    def watermark(self) -> Watermark | None:
        return None

    def entries(self, page: int = 1000) -> Iterator[tuple[str, dict[str, str]]]:
        for i, event in enumerate(self.events):
            names = ("seq", "ts", "type", "subject", "data", "prev", "hash")
            yield f"{i + 1}-0", dict(zip(names, event.fields(), strict=True))

    def last(self, n: int) -> list[tuple[str, dict[str, str]]]:
        return list(self.entries())[-n:]


@dataclass
class MemoryCheckpoints:
    checkpoints: list[AuditCheckpoint] = field(default_factory=list)

    def save(self, checkpoint: AuditCheckpoint) -> None:
        self.checkpoints.append(checkpoint)

    def all(self) -> list[AuditCheckpoint]:
        return sorted(self.checkpoints, key=lambda c: c.seq)

    def newest(self, limit: int) -> list[AuditCheckpoint]:
        return sorted(self.checkpoints, key=lambda c: -c.seq)[:limit]


def chain_of(datas: list[dict[str, int]], start: int = 1, prev: str = GENESIS) -> list[AuditEvent]:
    events = []
    for i, data in enumerate(datas):
        event = AuditEvent.chained(start + i, prev, f"{1_700_000_000 + i:.6f}", "t", "s", json.dumps(data))
        events.append(event)
        prev = event.hash
    return events


def checkpoint(seq: int, head_hash: str) -> AuditCheckpoint:
    return AuditCheckpoint(
        seq=seq, head_hash=head_hash, signed_at=datetime.now(UTC), hmac=sign_checkpoint(SECRET, seq, head_hash)
    )


@st.composite
def chains(draw: st.DrawFn) -> tuple[MemoryChain, MemoryCheckpoints]:
    n = draw(st.integers(2, 30))
    events = chain_of([{"n": i} for i in range(n)])
    marks = draw(st.sets(st.integers(1, n), max_size=4))
    return MemoryChain(events, (n, events[-1].hash)), MemoryCheckpoints(
        [checkpoint(s, events[s - 1].hash) for s in marks]
    )


def broken(chain: MemoryChain, checkpoints: MemoryCheckpoints) -> bool:
    return not verify(chain, SECRET, checkpoints).ok


@PROFILE
@given(chains())
def test_an_intact_chain_verifies(made: tuple[MemoryChain, MemoryCheckpoints]) -> None:
    assert not broken(*made)


@PROFILE
@given(chains(), st.data())
def test_an_edited_field_is_caught(made: tuple[MemoryChain, MemoryCheckpoints], data: st.DataObject) -> None:
    chain, checkpoints = made
    i = data.draw(st.integers(0, len(chain.events) - 1))
    name = data.draw(st.sampled_from(["ts", "type", "subject", "data", "prev", "hash"]))
    event = chain.events[i]
    chain.events[i] = replace(event, **{name: getattr(event, name) + "0"})
    assert broken(chain, checkpoints)


@PROFILE
@given(chains(), st.data())
def test_a_deleted_or_swapped_event_is_caught(made: tuple[MemoryChain, MemoryCheckpoints], data: st.DataObject) -> None:
    chain, checkpoints = made
    i = data.draw(st.integers(0, len(chain.events) - 2))
    if data.draw(st.booleans()):
        del chain.events[i]
    else:
        chain.events[i], chain.events[i + 1] = chain.events[i + 1], chain.events[i]
    assert broken(chain, checkpoints)


@PROFILE
@given(chains(), st.data())
def test_a_truncated_tail_is_caught_by_the_head(
    made: tuple[MemoryChain, MemoryCheckpoints], data: st.DataObject
) -> None:
    chain, checkpoints = made
    k = data.draw(st.integers(1, len(chain.events) - 1))
    del chain.events[-k:]
    assert broken(chain, checkpoints)


@PROFILE
@given(chains(), st.data())
def test_a_suffix_rewritten_with_recomputed_hashes_is_caught_by_a_checkpoint_it_contradicts(
    made: tuple[MemoryChain, MemoryCheckpoints], data: st.DataObject
) -> None:
    chain, checkpoints = made
    n = len(chain.events)
    covered = [c.seq for c in checkpoints.checkpoints]
    i = data.draw(st.integers(0, n - 1))  # rewrite events i+1..n, head moved along (a full rewrite in Redis)
    prev = chain.events[i - 1].hash if i else GENESIS
    chain.events[i:] = chain_of([{"n": -1 - j} for j in range(n - i)], start=i + 1, prev=prev)
    chain.head_at = (n, chain.events[-1].hash)
    assert broken(chain, checkpoints) == any(seq > i for seq in covered)  # only a signed checkpoint can know


@PROFILE
@given(chains(), st.data())
def test_a_rollback_to_an_older_copy_is_caught_by_a_later_checkpoint(
    made: tuple[MemoryChain, MemoryCheckpoints], data: st.DataObject
) -> None:
    chain, checkpoints = made
    k = data.draw(st.integers(1, len(chain.events) - 1))
    del chain.events[-k:]
    chain.head_at = (len(chain.events), chain.events[-1].hash)  # the older copy's own head
    later = [c.seq for c in checkpoints.checkpoints if c.seq > len(chain.events)]
    assert broken(chain, checkpoints) == bool(later)


@PROFILE
@given(chains(), st.integers(1, 30))
def test_a_forged_checkpoint_is_caught(made: tuple[MemoryChain, MemoryCheckpoints], seq: int) -> None:
    chain, checkpoints = made
    checkpoints.save(AuditCheckpoint(seq=seq, head_hash="f" * 64, signed_at=datetime.now(UTC), hmac="0" * 64))
    assert broken(chain, checkpoints)
