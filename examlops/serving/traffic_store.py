"""Traffic rules in SQL (SQLModel): the adapter behind the ``TrafficRuleStore`` port.

One row per (model, alias) with its weight; a model's split is replaced as a
whole in one transaction. Every change is also appended to ``trafficchange``,
so what the split was and when it moved stays written down. Model names are
stored lower-cased, so a split set for JPCP applies to jpcp.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from datetime import UTC, datetime

from sqlalchemy.exc import OperationalError
from sqlmodel import Field, Session, SQLModel, select

from examlops.core.errors import StoreUnavailable

log = logging.getLogger(__name__)


class TrafficRule(SQLModel, table=True):
    model: str = Field(primary_key=True)
    alias: str = Field(primary_key=True)
    weight: int


class TrafficChange(SQLModel, table=True):
    id: int | None = Field(default=None, primary_key=True)
    model: str = Field(index=True)
    weights: str
    """The new split as JSON; ``{}`` when it was cleared."""
    changed_at: datetime


class SqlTrafficRuleStore:
    """Reads and replaces splits; raises ``StoreUnavailable`` when the database cannot be reached."""

    def __init__(self, engine: object) -> None:
        from sqlalchemy.engine import Engine

        assert isinstance(engine, Engine)
        self._engine = engine

    def get(self, model: str) -> dict[str, int]:
        try:
            with Session(self._engine) as session:
                rows = session.exec(select(TrafficRule).where(TrafficRule.model == model.lower())).all()
        except OperationalError as exc:
            raise StoreUnavailable(f"cannot read traffic rules: {exc.orig}") from exc
        return {row.alias: row.weight for row in rows}

    def set(self, model: str, weights: Mapping[str, int]) -> None:
        key = model.lower()
        try:
            with Session(self._engine) as session:
                for row in session.exec(select(TrafficRule).where(TrafficRule.model == key)).all():
                    session.delete(row)
                for alias, weight in weights.items():
                    session.add(TrafficRule(model=key, alias=alias, weight=int(weight)))
                session.add(
                    TrafficChange(
                        model=key, weights=json.dumps(dict(weights), sort_keys=True), changed_at=datetime.now(UTC)
                    )
                )
                session.commit()
        except OperationalError as exc:
            raise StoreUnavailable(f"cannot write traffic rules: {exc.orig}") from exc
        log.info("traffic split of %s set to %s", model, dict(weights))

    def history(self, model: str) -> list[tuple[datetime, dict[str, int]]]:
        with Session(self._engine) as session:
            rows = session.exec(
                select(TrafficChange).where(TrafficChange.model == model.lower()).order_by(TrafficChange.id)  # type: ignore[arg-type]  # SQLModel column typing
            ).all()
        return [(row.changed_at, json.loads(row.weights)) for row in rows]
