"""The audit trail against a real redis-server and SQLite: no fork under concurrency, every tampering caught.

Each tampering test writes 20 events with a checkpoint every 5, tampers the
real stream the way an attacker with Redis access could, and asserts that
``verify`` names the first broken link.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
import redis
from redis.exceptions import ConnectionError as RedisConnectionError
from typer.testing import CliRunner

from examlops.adapters.redis import connect
from examlops.bootstrap import sql_engine
from examlops.cli.audit import audit_app
from examlops.core.errors import StoreUnavailable
from examlops.core.settings import DEV_SECRET, Settings
from examlops.monitoring.audit import HEAD, STREAM, AuditEvent, AuditTrail, Entry, SideWrite
from examlops.monitoring.audit.checkpoints import AuditCheckpoint, SqlCheckpointStore, new_checkpoint
from examlops.monitoring.audit.store import AppendReply, RedisAuditStore
from examlops.monitoring.audit.verify import tail, verify
from tests.ports import free_port

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

SECRET = DEV_SECRET.encode()


@pytest.fixture
def checkpoints(settings: Settings) -> Iterator[SqlCheckpointStore]:
    engine = sql_engine(settings)
    yield SqlCheckpointStore(engine)
    engine.dispose()


@pytest.fixture
def trail(client: redis.Redis, checkpoints: SqlCheckpointStore) -> AuditTrail:
    return AuditTrail(client, SECRET, checkpoints, checkpoint_every=5)


def fill(trail: AuditTrail, n: int, start: int = 0) -> None:
    for i in range(start, start + n):
        trail.append("traffic.changed", f"model-{i % 3}", {"i": i, "weights": {"Production": 90, "Canary": 10}})


def stored(client: redis.Redis) -> list[tuple[str, dict[str, str]]]:
    found: Any = client.xrange(STREAM)
    return [(entry_id, dict(fields)) for entry_id, fields in found]


def rewrite(client: redis.Redis, entries: list[dict[str, str]], *, keep_head: bool = True) -> None:
    """Replace the stream with ``entries`` (fresh ids, in this order); point the head at the last unless kept."""
    client.delete(STREAM)
    for fields in entries:
        client.xadd(STREAM, fields)  # type: ignore[arg-type]
    if not keep_head:
        client.hset(HEAD, mapping={"seq": entries[-1]["seq"], "hash": entries[-1]["hash"]})


def broken(client: redis.Redis, checkpoints: SqlCheckpointStore) -> tuple[int, str, str]:
    report = verify(client, SECRET, checkpoints)
    assert report.broken is not None, "verify found nothing wrong"
    return report.broken.seq, report.broken.kind, report.broken.message


def test_an_untouched_trail_verifies_and_tail_shows_its_last_events(
    client: redis.Redis, trail: AuditTrail, checkpoints: SqlCheckpointStore
) -> None:
    fill(trail, 20)
    report = verify(client, SECRET, checkpoints)
    assert report.ok and report.events == 20 and report.last_seq == 20 and report.checkpoints == 4
    assert [cp.seq for cp in checkpoints.all()] == [5, 10, 15, 20]
    assert [event.seq for event in tail(client, 3)] == [18, 19, 20]
    assert tail(client, 1)[0].to_json()["data"]["i"] == 19


def test_events_with_and_without_side_writes_chain_in_one_append(
    client: redis.Redis, trail: AuditTrail, checkpoints: SqlCheckpointStore
) -> None:
    names = ("a", "b")
    side = SideWrite("test:side", names, ("1", "x"), "test:index", "m1")
    other = SideWrite("test:side", names, ("2", "y"), "test:index", "m2")
    entries = [Entry("t", "s", {"i": 0}, 1.0), Entry("t", "s", {"i": 1}, 2.0, "test:once:1", side)]
    entries += [Entry("t", "s", {}, 3.0), Entry("t", "s", {"i": 3}, 4.0, "test:once:3", other)]
    events = trail.append_many(entries)
    assert [e.seq for e in events if e is not None] == [1, 2, 3, 4]
    assert [fields for _, fields in client.xrange("test:side")] == [{"a": "1", "b": "x"}, {"a": "2", "b": "y"}]
    assert client.smembers("test:index") == {"m1", "m2"} and client.exists("test:once:1", "test:once:3") == 2
    assert verify(client, SECRET, checkpoints).ok
    assert [s["prev"] for _, s in stored(client)][1:] == [e.hash for e in events[:-1] if e is not None]
    mixed = [Entry("t", "s", {}, 5.0, "", side), Entry("t", "s", {}, 6.0, "", SideWrite("test:side", ("c",), ("3",)))]
    with pytest.raises(ValueError, match="differ in their fields"):
        trail.append_many(mixed)
    for empty in (SideWrite("", names, ("1", "x")), SideWrite("test:side", (), ())):
        with pytest.raises(ValueError, match="needs a stream and at least one field"):
            trail.append_many([Entry("t", "s", {}, 7.0, "", empty)])
    assert client.xlen(STREAM) == 4 and client.xlen("test:side") == 2


def test_appends_survive_a_flushed_script_cache_and_a_killed_connection(
    redis_server: str, client: redis.Redis, trail: AuditTrail
) -> None:
    """NOSCRIPT (a restarted Redis) loads the script again, and a connection the server closed is replaced."""
    fill(trail, 2)
    client.script_flush()
    fill(trail, 1, start=2)
    with redis.Redis.from_url(redis_server) as other:
        assert other.client_kill_filter(_type="normal", skipme=True) >= 1  # the trail's idle pooled connection
    fill(trail, 1, start=3)
    assert [int(fields["seq"]) for _id, fields in stored(client)] == [1, 2, 3, 4]
    assert verify(client, SECRET, None).ok


def losing_answers(monkeypatch: pytest.MonkeyPatch, count: int) -> None:
    """The next ``count`` replies that redis-py reads are lost after the server sent them: the command ran."""
    real = redis.connection.Connection.read_response
    lost: list[bool] = []

    def read_response(self: redis.connection.Connection, *args: Any, **kwargs: Any) -> Any:
        answer = real(self, *args, **kwargs)
        if len(lost) < count:
            lost.append(True)
            raise RedisConnectionError("connection reset while reading the answer")
        return answer

    monkeypatch.setattr(redis.connection.Connection, "read_response", read_response)


def test_a_call_whose_answer_is_lost_and_sent_again_by_redis_py_is_written_once(
    client: redis.Redis, checkpoints: SqlCheckpointStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """redis-py sends a command again after a connection error (``adapters.redis.connect``'s retry): the trail's
    own call key turns the second run of a script that had run into 'done', and the call returns its events."""
    trail = AuditTrail(client, SECRET, checkpoints, checkpoint_every=2)
    fill(trail, 1)
    losing_answers(monkeypatch, 1)
    event = trail.append("t", "s", {"i": 1})
    monkeypatch.undo()
    assert event is not None and event.seq == 2 and event.prev == stored(client)[0][1]["hash"]
    assert [fields["seq"] for _id, fields in stored(client)] == ["1", "2"]
    assert [cp.seq for cp in checkpoints.all()] == [2]
    assert verify(client, SECRET, checkpoints).ok


def test_a_call_retried_after_its_answer_was_lost_is_written_once_and_keeps_its_checkpoints(
    client: redis.Redis, checkpoints: SqlCheckpointStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    trail = AuditTrail(client, SECRET, checkpoints, checkpoint_every=5, once_ttl_s=600)
    real = RedisAuditStore.append

    def losing_the_answer(self: RedisAuditStore, args: Sequence[str]) -> AppendReply:
        real(self, args)  # the script ran: the events are written
        raise StoreUnavailable("connection reset while reading the answer, every retry included")

    monkeypatch.setattr(RedisAuditStore, "append", losing_the_answer)
    entries = [Entry("t", "s", {"i": i}, float(i), f"test:once:{i}" if i == 3 else "", once_ttl_s=5) for i in range(7)]
    with pytest.raises(StoreUnavailable):
        trail.append_many(entries, call_key="test:call:1")
    monkeypatch.undo()
    # Before the retry, another writer of the same trail (the retrain outbox's thread) appends: the head moves.
    assert trail.append("other", "s", {"x": 1}) is not None
    assert trail.append_many(entries, call_key="test:call:1") == [None] * 7, "written by the first try"
    assert [fields["seq"] for _id, fields in stored(client)] == [str(seq) for seq in range(1, 9)]
    assert [cp.seq for cp in checkpoints.all()] == [5], "the lost try's checkpoint is still written"
    assert 590 < client.ttl("test:call:1") <= 600, "the call key lives the trail's once TTL"
    assert 0 < client.pttl("test:once:3") <= 5000, "an entry's once key keeps its own TTL"
    assert trail.append_many([]) == []
    assert verify(client, SECRET, checkpoints).ok


def test_eight_concurrent_writers_leave_one_unforked_chain(
    redis_server: str, client: redis.Redis, checkpoints: SqlCheckpointStore
) -> None:
    clients = [connect(redis_server) for _ in range(8)]
    trails = [AuditTrail(c, SECRET, checkpoints, checkpoint_every=50) for c in clients]
    start = threading.Barrier(8)

    def write(index: int) -> None:
        start.wait()
        for i in range(100):
            trails[index].append("test.concurrent", f"writer-{index}", {"i": i})

    threads = [threading.Thread(target=write, args=(i,)) for i in range(8)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        for c in clients:
            c.close()
    events = [AuditEvent.from_fields(entry_id, fields) for entry_id, fields in stored(client)]
    assert [e.seq for e in events] == list(range(1, 801))
    assert len({e.prev for e in events}) == 800, "two events share a parent: the chain forked"
    assert verify(client, SECRET, checkpoints).ok
    assert sum(t.contended for t in trails) > 0, "the writers never raced; the test proves nothing"


def test_audit_verify_detects_an_edited_field(
    client: redis.Redis, trail: AuditTrail, checkpoints: SqlCheckpointStore
) -> None:
    fill(trail, 20)
    entries = [fields for _, fields in stored(client)]
    entries[7]["data"] = entries[7]["data"].replace('"Canary":10', '"Canary":90')
    rewrite(client, entries)
    assert broken(client, checkpoints)[:2] == (8, "edited")


def test_audit_verify_detects_a_deleted_event(
    client: redis.Redis, trail: AuditTrail, checkpoints: SqlCheckpointStore
) -> None:
    fill(trail, 20)
    client.xdel(STREAM, stored(client)[7][0])
    seq, kind, message = broken(client, checkpoints)
    assert (seq, kind) == (8, "deleted") and "event 8 is missing" in message


def test_audit_verify_detects_events_trimmed_from_the_start(
    client: redis.Redis, trail: AuditTrail, checkpoints: SqlCheckpointStore
) -> None:
    fill(trail, 20)
    assert client.xtrim(STREAM, maxlen=15, approximate=False) == 5
    assert broken(client, checkpoints)[:2] == (1, "deleted")


def test_audit_verify_detects_reordered_events(
    client: redis.Redis, trail: AuditTrail, checkpoints: SqlCheckpointStore
) -> None:
    fill(trail, 20)
    entries = [fields for _, fields in stored(client)]
    entries[7], entries[8] = entries[8], entries[7]
    rewrite(client, entries)
    assert broken(client, checkpoints)[:2] == (8, "reordered")


def test_audit_verify_detects_a_truncated_tail_even_with_the_head_moved_back(
    client: redis.Redis, trail: AuditTrail, checkpoints: SqlCheckpointStore
) -> None:
    fill(trail, 20)
    entries = [fields for _, fields in stored(client)]
    rewrite(client, entries[:17], keep_head=False)
    seq, kind, message = broken(client, checkpoints)
    assert (seq, kind) == (18, "truncated") and "event 20" in message


def test_audit_verify_detects_a_truncated_tail_by_the_head(
    client: redis.Redis, trail: AuditTrail, checkpoints: SqlCheckpointStore
) -> None:
    fill(trail, 17)  # the last checkpoint is at 15: only the head knows about 16 and 17
    for entry_id, _ in stored(client)[15:]:
        client.xdel(STREAM, entry_id)
    assert broken(client, checkpoints)[:2] == (16, "truncated")


def test_audit_verify_detects_a_suffix_rewritten_with_recomputed_hashes(
    client: redis.Redis, trail: AuditTrail, checkpoints: SqlCheckpointStore
) -> None:
    fill(trail, 20)
    entries = [fields for _, fields in stored(client)]
    prev = entries[10]["hash"]
    for fields in entries[11:]:  # seq 12 onwards: edited, and every hash recomputed
        data = json.loads(fields["data"])
        data["weights"] = {"Production": 0, "Canary": 100}
        event = AuditEvent.chained(
            int(fields["seq"]), prev, fields["ts"], fields["type"], fields["subject"], json.dumps(data)
        )
        fields.update(data=event.data, prev=event.prev, hash=event.hash)
        prev = event.hash
    rewrite(client, entries, keep_head=False)
    assert verify(client, SECRET, None).ok, "the rewritten chain is self-consistent: only checkpoints can tell"
    seq, kind, message = broken(client, checkpoints)
    assert (seq, kind) == (15, "rewritten") and "after event 10" in message


def test_audit_verify_detects_a_rollback_to_an_older_copy(
    redis_server: str, client: redis.Redis, trail: AuditTrail, checkpoints: SqlCheckpointStore
) -> None:
    raw = redis.Redis.from_url(redis_server)
    try:
        fill(trail, 12)
        copy = {key: raw.dump(key) for key in (STREAM, HEAD)}
        fill(trail, 8, start=12)
        for key, value in copy.items():
            raw.restore(key, 0, value, replace=True)  # type: ignore[arg-type]
    finally:
        raw.close()
    seq, kind, message = broken(client, checkpoints)
    assert (seq, kind) == (13, "truncated") and "older copy" in message
    # Appending on top of the restored copy writes other events 13.., which the checkpoint at 15 contradicts.
    fill(AuditTrail(client, SECRET, None), 8, start=100)
    assert broken(client, checkpoints)[:2] == (15, "rewritten")


def test_audit_verify_detects_a_forged_checkpoint(
    client: redis.Redis, trail: AuditTrail, checkpoints: SqlCheckpointStore
) -> None:
    fill(trail, 20)
    forged = new_checkpoint(b"not-the-secret", 3, stored(client)[2][1]["hash"], 0.0)
    checkpoints.save(AuditCheckpoint.model_validate(forged.model_dump()))
    assert broken(client, checkpoints)[:2] == (3, "forged_checkpoint")


def test_a_checkpoint_is_written_after_the_interval_so_a_short_tail_is_covered(
    client: redis.Redis, checkpoints: SqlCheckpointStore
) -> None:
    now = [1000.0]
    trail = AuditTrail(
        client, SECRET, checkpoints, checkpoint_every=100, checkpoint_interval_s=60, clock=lambda: now[0]
    )
    fill(trail, 3)
    trail.tick()
    assert checkpoints.all() == []
    now[0] += 60
    trail.tick()
    assert [cp.seq for cp in checkpoints.all()] == [3]
    rewrite(client, [fields for _, fields in stored(client)][:2], keep_head=False)
    assert broken(client, checkpoints)[:2] == (3, "truncated")


def test_exa_audit_verify_and_tail(
    client: redis.Redis, trail: AuditTrail, redis_server: str, settings: Settings
) -> None:
    fill(trail, 6)
    runner = CliRunner()
    env = {"EXAMLOPS_REDIS__URL": redis_server, "EXAMLOPS_HOME": str(settings.home)}
    result = runner.invoke(audit_app, ["verify", "--json"], env=env)
    assert result.exit_code == 0, result.output
    expected = {"ok": True, "events": 6, "archived": 0, "last_seq": 6, "checkpoints": 1, "broken": None}
    expected |= {"aliases_unaccounted": [], "aliases_unchecked": None}  # no alias moved: none to account for
    expected |= {"aliases_not_covered": []}  # no MLflow store yet: no alias at all
    assert json.loads(result.stdout) == expected
    result = runner.invoke(audit_app, ["tail", "-n", "2", "--json"], env=env)
    assert result.exit_code == 0, result.output
    assert [event["seq"] for event in json.loads(result.stdout)] == [5, 6]
    assert tail(client, 1)[0].hash[:12] in runner.invoke(audit_app, ["tail"], env=env).output

    client.xdel(STREAM, stored(client)[1][0])
    result = runner.invoke(audit_app, ["verify"], env=env)
    assert result.exit_code == 1
    assert "broken" in result.output and "seq 2" in result.output


def test_exa_audit_verify_with_mlflow_unreachable_stores_that_the_aliases_were_not_checked(
    client: redis.Redis, trail: AuditTrail, redis_server: str, settings: Settings
) -> None:
    from examlops.monitoring.audit import ALIAS_MOVED
    from examlops.monitoring.audit.verified import last_verify

    move = {"model": "AC", "alias": "Production", "old_version": "1", "new_version": "2", "from": "1", "to": "2"}
    trail.append(ALIAS_MOVED, "AC", {**move, "by": "test", "actor": "t"})
    env = {"EXAMLOPS_REDIS__URL": redis_server, "EXAMLOPS_HOME": str(settings.home)}
    env |= {"EXAMLOPS_MLFLOW__TRACKING_URI": f"http://127.0.0.1:{free_port()}", "EXAMLOPS_MLFLOW__MAX_RETRIES": "0"}
    result = CliRunner().invoke(audit_app, ["verify", "--json"], env=env)
    assert result.exit_code == 0, result.output  # the chain is intact; what was not checked is said, not failed
    assert json.loads(result.stdout)["aliases_unchecked"]
    stored = last_verify(client, SECRET)
    assert stored is not None and stored.ok and stored.by == "exa audit verify"
    assert len(stored.notes) == 1 and stored.notes[0].startswith("aliases not checked: ")


def test_exa_audit_verify_without_redis_exits_3(settings: Settings) -> None:

    env = {"EXAMLOPS_REDIS__URL": f"redis://127.0.0.1:{free_port()}/0", "EXAMLOPS_HOME": str(settings.home)}
    result = CliRunner().invoke(audit_app, ["verify"], env=env)
    assert result.exit_code == 3, result.output
