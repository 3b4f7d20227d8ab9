"""A trace batch's statement as the DB-API driver runs it (``SqlTraceStore``): compiled once, its rows tuples.

``DriverStatement.compile(statement, dialect, table)`` compiles an insert of every column of ``table``
(SQLAlchemy's SQL text and bind order for ``dialect``) and keeps each column's bind processor;
``parameters(records)`` turns ``TraceRecord``s into the driver's parameters: the values
``Connection.execute`` would send with one dict per row, without SQLAlchemy's per-row processing
(bench/RESULTS.md). On SQLite ``at`` goes as the text SQLAlchemy's ``DateTime`` stores (``sqlite_at``),
made in one call instead of a datetime and two processors, and ``Float`` columns go as they are (their
processor only makes a float, which SQLite's REAL affinity does on storing): a row is one tuple built in one
expression. A statement whose binds are not the table's
columns is a ``RuntimeError`` at compile time.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Float, Table
from sqlalchemy.engine import Dialect

from examlops.tracing.record import TraceRecord


def sqlite_at(at: float) -> str:
    """The text SQLAlchemy's SQLite ``DateTime`` stores for the UTC time of ``at`` (UNIX seconds):
    ``YYYY-MM-DD HH:MM:SS.ffffff``, microseconds always written, rounded as ``datetime.fromtimestamp`` rounds.

    The date and time of the last whole second are kept: a batch's traces share their seconds, and a
    datetime per row was most of the row's conversion (bench/RESULTS.md)."""
    fraction, whole = math.modf(at)
    micros, second = round(fraction * 1e6), int(whole)
    if micros >= 1_000_000:
        second, micros = second + 1, micros - 1_000_000
    elif micros < 0:
        second, micros = second - 1, micros + 1_000_000
    last = _last_second[0]
    if last[0] != second:
        last = _last_second[0] = (second, datetime.fromtimestamp(second, UTC).isoformat(" ")[:19])
    return f"{last[1]}.{micros:06d}"


_last_second: list[tuple[int | None, str]] = [(None, "")]
"""``sqlite_at``'s last whole second and its text, one tuple replaced whole (threads see a consistent pair)."""


def _aware(at: float) -> datetime:
    return datetime.fromtimestamp(at, UTC)


@dataclass(frozen=True, slots=True)
class DriverStatement:
    """One statement as the driver runs it: its SQL, and how a record becomes its parameters."""

    sql: str
    columns: tuple[str, ...]
    """The table's columns in order: each is a ``TraceRecord`` field (``at`` UNIX seconds there)."""
    binds: tuple[str, ...]
    """The statement's parameters in order (positional paramstyles) or by name."""
    positional: bool
    processors: tuple[tuple[int, Callable[[Any], Any]], ...]
    """(column index, SQLAlchemy's bind processor of the column's type on this dialect)."""
    at_of: Callable[[float], Any]
    """``at`` as the driver takes it: SQLite's text (``sqlite_at``), else an aware datetime then processed."""

    @classmethod
    def compile(cls, statement: Any, dialect: Dialect, table: Table) -> DriverStatement:
        columns = tuple(column.name for column in table.columns)
        compiled = statement.compile(dialect=dialect, column_keys=list(columns))
        binds = tuple(compiled.positiontup) if dialect.positional else tuple(compiled.binds)
        if set(binds) != set(columns):
            raise RuntimeError(f"the trace statement binds {binds}, not the columns {columns}")
        at_text = dialect.name == "sqlite"
        at = columns.index("at")
        processors = []
        for index, column in enumerate(table.columns):
            processor = column.type.dialect_impl(dialect).bind_processor(dialect)
            if processor is not None and not (at_text and (index == at or isinstance(column.type, Float))):
                processors.append((index, processor))
        at_of = sqlite_at if at_text else _aware
        return cls(compiled.string, columns, binds, dialect.positional, tuple(processors), at_of)

    def parameters(self, records: Sequence[TraceRecord]) -> list[Any]:
        columns, at_of, processors = self.columns, self.at_of, self.processors
        if not processors and self.positional and self.binds == columns and columns.index("at") == 1:
            first, rest = columns[0], operator.attrgetter(*columns[2:])  # SQLite: the trace table's order
            return [(getattr(r, first), at_of(r.at), *rest(r)) for r in records]
        values_of, at = operator.attrgetter(*columns), columns.index("at")
        rows: list[list[Any]] = []
        for record in records:
            values = list(values_of(record))
            values[at] = at_of(record.at)
            for index, processor in processors:
                values[index] = processor(values[index])
            rows.append(values)
        if self.positional:
            if self.binds == columns:
                return [tuple(values) for values in rows]
            order = [columns.index(name) for name in self.binds]
            return [tuple(values[i] for i in order) for values in rows]
        return [dict(zip(columns, values, strict=True)) for values in rows]
