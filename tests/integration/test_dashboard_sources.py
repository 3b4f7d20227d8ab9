"""The dashboard's drift source on real SQL (SQLite and Postgres): each model reads its own newest rows."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import redis
from sqlmodel import Session
from typer.testing import CliRunner

from examlops.bootstrap import upgrade_database
from examlops.bootstrap.dashboard import dashboard_sources
from examlops.bootstrap.sql import sql_engine
from examlops.core.settings import RedisSettings, Settings
from examlops.monitoring.drift_store import DriftStatus


def status(model: str, n: int, at: datetime) -> DriftStatus:
    return DriftStatus(
        model=model, kind="prediction", version="1", drifted=False, score=0.5, method="ks", threshold=0.05,
        columns=json.dumps([]), reference="train", reference_rows=100, current_rows=100, first_id=f"{n}-0",
        last_id=f"{n}-1", window_start=at, window_end=at, report_html=f"/r/{model}-{n}.html",
        report_json=f"/r/{model}-{n}.json", created_at=at,
    )  # fmt: skip


def test_a_busy_model_hides_no_other_models_drift(tmp_path: Path, database_url: str) -> None:
    settings = Settings(home=tmp_path, database_url=database_url)
    upgrade_database(settings)
    engine = sql_engine(settings)
    start = datetime(2026, 12, 1, tzinfo=UTC)
    with Session(engine) as session:
        session.add(status("AC", 0, start))
        for n in range(600):
            session.add(status("JPCP", n, start + timedelta(minutes=n)))
        session.commit()
    drift = dashboard_sources(settings, engine, lambda kind, subject, data: None).drift
    assert drift is not None
    assert [p.report_html for p in drift.history("AC", 500)] == ["/r/AC-0.html"]
    busy = drift.history("JPCP", 500)
    assert len(busy) == 500 and busy[0].report_html == "/r/JPCP-100.html" and busy[-1].report_html == "/r/JPCP-599.html"
    engine.dispose()


def test_the_control_page_reads_the_verify_result_stored_by_exa_audit_verify(
    client: redis.Redis, redis_server: str, settings: Settings
) -> None:
    """Serving shows the last stored check, never walks the chain: events appended since leave it as it was."""
    from examlops.bootstrap.control import audit_trail
    from examlops.cli.audit import audit_app
    from examlops.core.keys import AUDIT_VERIFIED

    live = settings.model_copy(update={"redis": RedisSettings(url=redis_server)})
    engine = sql_engine(live)
    audit = dashboard_sources(live, engine, lambda kind, subject, data: None).audit
    assert audit is not None and audit.last_check() is None
    with audit_trail(live) as trail:
        for i in range(4):
            trail.append("traffic.changed", "AC", {"i": i})
    env = {"EXAMLOPS_REDIS__URL": redis_server, "EXAMLOPS_HOME": str(settings.home)}
    result = CliRunner().invoke(audit_app, ["verify"], env=env)
    assert result.exit_code == 0, result.output
    check = audit.last_check()
    assert check is not None and check.broken is None and check.events == 4 and check.by == "exa audit verify"
    assert abs(check.at - time.time()) < 60
    with audit_trail(live) as trail:
        trail.append("traffic.changed", "AC", {"i": 4})
    assert audit.last_check() == check

    stored = json.loads(client.get(AUDIT_VERIFIED) or "{}")
    client.set(AUDIT_VERIFIED, json.dumps({**stored, "body": stored["body"].replace('"events": 4', '"events": 9')}))
    forged = audit.last_check()
    assert forged is not None and forged.broken is not None and "not signed" in forged.broken
    engine.dispose()


def test_a_scheduled_verify_skips_while_another_holds_the_lease(
    client: redis.Redis, redis_server: str, settings: Settings
) -> None:
    from examlops.flows.retention import verify_audit
    from examlops.monitoring.audit.verified import last_verify, one_verify

    live = settings.model_copy(update={"redis": RedisSettings(url=redis_server)})
    with one_verify(client) as first, one_verify(client) as second:
        assert first and not second
        assert verify_audit.fn(live)["skipped"] == "another audit verify is running"
        assert last_verify(client, live.secret.get_secret_value().encode()) is None
    done = verify_audit.fn(live)  # the lease is free again
    assert done["ok"] and done["by"] == "retention flow"
