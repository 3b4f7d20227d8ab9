"""The loop records on SQLite and a real Postgres: one live holder per model however many runs race for it,
a dead holder's lease lets another take over, only the holder writes, and an abort reaches only a held model."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from examlops.bootstrap import upgrade_database
from examlops.bootstrap.sql import sql_engine
from examlops.core.settings import Settings
from examlops.loop.sql import SqlLoopStore
from examlops.loop.state import Phase

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


@pytest.fixture
def store(database_url: str, tmp_path: Path) -> Iterator[SqlLoopStore]:
    settings = Settings(home=tmp_path, database_url=database_url)
    upgrade_database(settings)
    engine = sql_engine(settings)
    yield SqlLoopStore(engine)
    engine.dispose()


def test_of_eight_runs_racing_for_a_new_model_exactly_one_holds_it(store: SqlLoopStore) -> None:
    start, won = threading.Barrier(8), []

    def race(owner: str) -> None:
        start.wait()
        if store.claim("JPCP", owner, Phase.RETRAINING, time.time(), 120.0, run=owner) is not None:
            won.append(owner)

    threads = [threading.Thread(target=race, args=(f"run-{i}",)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    record = store.get("JPCP")
    assert len(won) == 1 and record is not None and record.owner == won[0] and record.phase is Phase.RETRAINING


def test_only_the_holder_writes_and_a_dead_holders_lease_lets_another_take_over(store: SqlLoopStore) -> None:
    now = time.time()
    held = store.claim("AC", "a", Phase.CANARY, now, 60.0, share=10, restore={"Production": 100}, figures={"x": 1})
    assert held is not None and held.restore == {"Production": 100} and held.figures == {"x": 1}
    assert store.claim("AC", "b", Phase.CANARY, now + 30, 60.0) is None
    assert store.update("AC", "b", now + 30, note="not mine") is None
    assert store.update("AC", "a", now + 30, note="watching") is not None
    assert store.claim("AC", "b", Phase.CANARY, now + 80, 60.0) is None  # renewed at +30: alive until +90
    taken = store.claim("AC", "b", Phase.CANARY, now + 100, 60.0)
    assert taken is not None and taken.owner == "b" and taken.restore == {"Production": 100}
    assert store.finish("AC", "a", Phase.PROMOTED, now + 101) is None
    done = store.finish("AC", "b", Phase.PROMOTED, now + 101, promoted_at=now + 101, replaced_version="1")
    assert done is not None and done.owner is None and done.promoted_at == pytest.approx(now + 101)
    assert store.claim("AC", "c", Phase.RETRAINING, now + 102, 60.0) is not None  # a final phase holds nothing


def test_an_abort_reaches_only_a_held_model(store: SqlLoopStore) -> None:
    now = time.time()
    assert store.request_abort("CRCP", now) is None
    store.claim("CRCP", "a", Phase.CANARY, now, 60.0)
    asked = store.request_abort("CRCP", now)
    assert asked is not None and asked.abort_requested
    store.finish("CRCP", "a", Phase.ABORTED, now)
    assert store.request_abort("CRCP", now) is None and [r.model for r in store.list()] == ["CRCP"]
