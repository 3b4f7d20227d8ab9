"""Audit retention: archive runs that crash, runs that meet a broken chain, and verify across archive and stream.

The live chain is ``InMemoryAuditStore`` (the archive-trim script's semantics); the archive is real files
in a temp folder. ``tests/integration/test_audit_archive.py`` runs the same against a real redis-server.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from examlops.core.errors import Conflict, StoreUnavailable
from examlops.monitoring.audit.archive import Archiver
from examlops.monitoring.audit.checkpoints import new_checkpoint
from examlops.monitoring.audit.segments import ArchiveFiles
from examlops.monitoring.audit.verify import tail, verify
from tests.unit.monitoring.audit_fakes import SECRET, InMemoryAuditStore, InMemoryCheckpoints, rewrite_line


@pytest.fixture
def store() -> InMemoryAuditStore:
    return InMemoryAuditStore()


@pytest.fixture
def checkpoints() -> InMemoryCheckpoints:
    return InMemoryCheckpoints()


@pytest.fixture
def files(tmp_path: Path) -> ArchiveFiles:
    return ArchiveFiles(tmp_path / "audit" / "archive")


@pytest.fixture
def archiver(store: InMemoryAuditStore, checkpoints: InMemoryCheckpoints, files: ArchiveFiles) -> Archiver:
    return Archiver(store, checkpoints, SECRET, files, page=7)


def seqs(store: InMemoryAuditStore) -> list[int]:
    return [int(fields["seq"]) for _id, fields in store.stream]


def archived_seqs(files: ArchiveFiles) -> list[int]:
    return [int(record["seq"]) for _where, record in files.records()]


def test_the_checkpointed_events_move_to_one_segment_and_leave_the_stream(
    store: InMemoryAuditStore, checkpoints: InMemoryCheckpoints, files: ArchiveFiles, archiver: Archiver
) -> None:
    store.fill(25, checkpoints, every=10)
    report = archiver.run()
    assert (report.archived, report.first_seq, report.last_seq, report.trimmed) == (20, 1, 20, 20)
    assert report.segment == str(files.directory / "000000000001-000000000020.jsonl")
    assert archived_seqs(files) == list(range(1, 21)) and seqs(store) == list(range(21, 26))
    assert store.mark is not None and store.mark.seq == 20
    result = verify(store, SECRET, checkpoints, archive=files)
    assert result.ok and (result.events, result.archived, result.last_seq) == (25, 20, 25)
    assert [e.seq for e in tail(store, 8, archive=files)] == list(range(18, 26))


def test_nothing_is_archived_twice_and_each_run_adds_one_segment(
    store: InMemoryAuditStore, checkpoints: InMemoryCheckpoints, files: ArchiveFiles, archiver: Archiver
) -> None:
    store.fill(12, checkpoints, every=10)
    assert archiver.run().archived == 10
    again = archiver.run()
    assert (again.archived, again.trimmed, again.archive_last_seq) == (0, 0, 10)
    store.fill(13, checkpoints, every=10)  # events 13..25, checkpoints 20
    third = archiver.run()
    assert (third.first_seq, third.last_seq, third.trimmed) == (11, 20, 10)
    assert [p.name for p in files.segments()] == ["000000000001-000000000010.jsonl", "000000000011-000000000020.jsonl"]
    assert archived_seqs(files) == list(range(1, 21)) and seqs(store) == list(range(21, 26))
    assert verify(store, SECRET, checkpoints, archive=files).ok


def test_a_crash_while_writing_a_segment_archives_nothing_and_the_next_run_archives_once(
    store: InMemoryAuditStore, checkpoints: InMemoryCheckpoints, files: ArchiveFiles, archiver: Archiver
) -> None:
    store.fill(30, checkpoints, every=10)
    store.fail_reading_after = 17
    with pytest.raises(StoreUnavailable):
        archiver.run()
    assert files.segments() == [] and list(files.directory.iterdir()) == [files.directory / ".lock"]
    assert seqs(store) == list(range(1, 31)) and store.mark is None
    assert archiver.run().archived == 30
    assert archived_seqs(files) == list(range(1, 31)) and seqs(store) == []
    assert verify(store, SECRET, checkpoints, archive=files).ok


def test_a_partial_segment_left_by_a_killed_run_is_removed_by_the_next(
    store: InMemoryAuditStore, checkpoints: InMemoryCheckpoints, files: ArchiveFiles, archiver: Archiver
) -> None:
    store.fill(10, checkpoints, every=10)
    files.directory.mkdir(parents=True)
    (files.directory / ".000000000001-000000000010.jsonl.partial").write_text('{"seq":1,"ts":')
    assert archiver.run().archived == 10
    assert sorted(p.name for p in files.directory.iterdir()) == [".lock", "000000000001-000000000010.jsonl"]


def test_a_crash_between_segment_and_trim_is_finished_by_the_next_run_without_a_second_copy(
    store: InMemoryAuditStore, checkpoints: InMemoryCheckpoints, files: ArchiveFiles, archiver: Archiver
) -> None:
    store.fill(23, checkpoints, every=10)
    store.fail_trims = 1
    with pytest.raises(StoreUnavailable):
        archiver.run()
    assert archived_seqs(files) == list(range(1, 21)) and seqs(store) == list(range(1, 24))
    # Meanwhile the chain reads as one: the copies still in the stream are the archived events.
    result = verify(store, SECRET, checkpoints, archive=files)
    assert result.ok and (result.events, result.archived) == (23, 20)
    assert [e.seq for e in tail(store, 30, archive=files)] == list(range(1, 24))
    report = archiver.run()
    assert (report.archived, report.trimmed, report.archive_last_seq) == (0, 20, 20)
    assert len(files.segments()) == 1 and seqs(store) == [21, 22, 23]
    assert verify(store, SECRET, checkpoints, archive=files).ok


def test_verify_names_an_edited_event_in_the_archive_by_file_and_line(
    store: InMemoryAuditStore, checkpoints: InMemoryCheckpoints, files: ArchiveFiles, archiver: Archiver
) -> None:
    store.fill(20, checkpoints, every=10)
    archiver.run()
    [segment] = files.segments()
    rewrite_line(segment, 4, data='{"seq":40}')
    broken = verify(store, SECRET, checkpoints, archive=files).broken
    assert broken is not None and (broken.seq, broken.kind) == (4, "edited")
    assert broken.entry_id == f"{segment.name}:4"


def test_verify_catches_an_archive_rewritten_with_recomputed_hashes_by_its_checkpoints(
    store: InMemoryAuditStore, checkpoints: InMemoryCheckpoints, files: ArchiveFiles, archiver: Archiver
) -> None:
    from examlops.monitoring.audit.chain import AuditEvent

    store.fill(20, checkpoints, every=5)
    archiver.run()
    [segment] = files.segments()
    prev = None
    for record in [r for _where, r in files.records()]:
        if record["seq"] >= 7:
            event = AuditEvent.chained(record["seq"], prev, record["ts"], record["type"], "forged", record["data"])
            rewrite_line(segment, record["seq"], subject="forged", prev=event.prev, hash=event.hash)
            record["hash"] = event.hash
        prev = record["hash"]
    assert verify(store, SECRET, None, archive=files).broken is not None, "event 21's link still tells"
    broken = verify(store, SECRET, checkpoints, archive=files).broken
    assert broken is not None and (broken.seq, broken.kind) == (10, "rewritten")


def test_verify_notices_archive_files_that_went_missing(
    store: InMemoryAuditStore, checkpoints: InMemoryCheckpoints, files: ArchiveFiles, archiver: Archiver
) -> None:
    store.fill(25, checkpoints, every=10)
    archiver.run()
    files.segments()[0].unlink()
    broken = verify(store, SECRET, checkpoints, archive=files).broken
    assert broken is not None and (broken.seq, broken.kind) == (1, "deleted")
    assert "up to 20 as archived" in broken.message
    with pytest.raises(Conflict, match="files are missing"):
        archiver.run()
    assert seqs(store) == list(range(21, 26))


def test_verify_notices_a_deleted_line_in_the_archive(
    store: InMemoryAuditStore, checkpoints: InMemoryCheckpoints, files: ArchiveFiles, archiver: Archiver
) -> None:
    store.fill(20, checkpoints, every=10)
    archiver.run()
    [segment] = files.segments()
    lines = segment.read_text().splitlines(keepends=True)
    segment.write_text("".join(lines[:5] + lines[6:]))
    broken = verify(store, SECRET, checkpoints, archive=files).broken
    assert broken is not None and (broken.seq, broken.kind) == (6, "deleted")


def test_a_broken_chain_is_not_archived(
    store: InMemoryAuditStore, checkpoints: InMemoryCheckpoints, files: ArchiveFiles, archiver: Archiver
) -> None:
    store.fill(20, checkpoints, every=10)
    store.edit(13, subject="tampered")
    with pytest.raises(Conflict, match=r"event 13 .* does not match its hash"):
        archiver.run()
    assert files.segments() == [] and seqs(store) == list(range(1, 21))
    store.edit(13, subject="s")
    del store.stream[4]  # event 5 gone
    with pytest.raises(Conflict, match="event 5 is missing"):
        archiver.run()
    assert files.segments() == []


def test_only_a_genuine_checkpoint_moves_events_out(
    store: InMemoryAuditStore, checkpoints: InMemoryCheckpoints, files: ArchiveFiles, archiver: Archiver
) -> None:
    store.fill(19, checkpoints, every=10)
    event_15 = store.stream[14][1]
    checkpoints.save(new_checkpoint(b"not-the-secret", 15, event_15["hash"], 0.0))
    assert archiver.run().last_seq == 10


def test_an_archive_run_is_refused_while_the_archive_is_read_or_archived(
    store: InMemoryAuditStore, checkpoints: InMemoryCheckpoints, files: ArchiveFiles, archiver: Archiver
) -> None:
    store.fill(10, checkpoints, every=10)
    with files.reading(), pytest.raises(Conflict, match="the audit archive is in use"):
        archiver.run()
    with files.locked(), pytest.raises(Conflict, match="the audit archive is in use"):
        archiver.run()
    assert archiver.run().archived == 10


def test_an_archiver_of_another_state_folder_is_refused_and_writes_nothing(
    store: InMemoryAuditStore, checkpoints: InMemoryCheckpoints, tmp_path: Path, archiver: Archiver
) -> None:
    store.fill(20, checkpoints, every=10)
    archiver.run()
    other = ArchiveFiles(tmp_path / "other")
    with pytest.raises(Conflict, match="another state folder"):
        Archiver(store, checkpoints, SECRET, other).run()
    assert other.segments() == []
