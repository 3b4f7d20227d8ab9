"""The dashboard's drift source on real SQL (SQLite and Postgres): each model reads its own newest rows."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

from sqlmodel import Session

from examlops.bootstrap import upgrade_database
from examlops.bootstrap.dashboard import dashboard_sources
from examlops.bootstrap.sql import sql_engine
from examlops.core.settings import Settings
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
