"""`exa trace list|show`: the trace of every call, read from SQL.

Thin: parse, read through ``bootstrap.tracing.trace_reader``, format. Exit codes come from ``output.py``
(4 for a trace id that is not stored).
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

import typer

from examlops.cli.output import JsonOption, console, errors_as_exit, load_settings, print_json, print_table
from examlops.core.errors import NotFound
from examlops.tracing import TraceQuery, TraceRecord, trace_fields
from examlops.tracing.store import parse_since

trace_app = typer.Typer(help="The trace of every call (HTTP and bus): who, what, where, how long, outcome.",
                        no_args_is_help=True)  # fmt: skip


def trace_json(record: TraceRecord) -> dict[str, Any]:
    data = trace_fields(record)
    data["time"] = datetime.fromtimestamp(record.at, UTC).isoformat()
    return data


@trace_app.command("list")
def list_traces(
    identity: Annotated[str | None, typer.Option(help="Only this identity's calls.")] = None,
    task: Annotated[str | None, typer.Option(help="Only calls for this task.")] = None,
    model: Annotated[str | None, typer.Option(help="Only calls that named this model (catalog spelling).")] = None,
    outcome: Annotated[Literal["answered", "refused", "failed"] | None, typer.Option(help="Only this outcome.")] = None,
    since: Annotated[str | None, typer.Option(help="Calls since: 15m, 2h, 7d, an ISO time or UNIX seconds.")] = None,
    limit: Annotated[int, typer.Option(min=1, max=1000, help="At most this many, newest first.")] = 50,
    as_json: JsonOption = False,
) -> None:
    """The newest traces matching every filter given."""
    from examlops.bootstrap import sql_engine
    from examlops.bootstrap.identity import acting_identity
    from examlops.bootstrap.tracing import trace_reader
    from examlops.identity import Permission

    settings = load_settings()
    with errors_as_exit():
        acting_identity(settings, Permission.READ_TRACES)
        when = None if since is None else parse_since(since, time.time())
        query = TraceQuery(identity=identity, task=task, model=model, outcome=outcome, since=when, limit=limit)
        records = trace_reader(sql_engine(settings)).find(query)
    if as_json:
        print_json([trace_json(r) for r in records])
        return
    if not records:
        console.print("no trace matches")
        return
    print_table(
        "traces (newest first): `exa trace show ID` for every field",
        ["trace", "time", "identity", "task", "outcome", "model", "ms"],
        [
            [
                r.trace_id,
                f"{datetime.fromtimestamp(r.at, UTC):%m-%d %H:%M:%S}",
                r.identity or "",
                r.task or "",
                f"{r.outcome} ({r.error_code})" if r.error_code else r.outcome,
                _served_by(r.model, r.alias, r.version),
                f"{r.used_ms:.1f}",
            ]
            for r in records
        ],
    )


def _served_by(model: str | None, alias: str | None, version: str | None) -> str:
    """``JPCP@Production v3``, as much of it as the trace holds."""
    if not model:
        return ""
    return model + (f"@{alias}" if alias else "") + (f" v{version}" if version else "")


@trace_app.command("show")
def show_trace(trace_id: Annotated[str, typer.Argument(help="The id from X-Examlops-Trace or a bus reply's trace.")],
               as_json: JsonOption = False) -> None:  # fmt: skip
    """One trace, every field."""
    from examlops.bootstrap import sql_engine
    from examlops.bootstrap.identity import acting_identity
    from examlops.bootstrap.tracing import trace_reader
    from examlops.identity import Permission

    settings = load_settings()
    with errors_as_exit():
        acting_identity(settings, Permission.READ_TRACES)
        record = trace_reader(sql_engine(settings)).get(trace_id.strip().lower())
        if record is None:
            raise NotFound(f"no trace {trace_id[:64]!r} (a call's trace reaches the store within about a second of it)")
    data = trace_json(record)
    if as_json:
        print_json(data)
        return
    print_table(f"trace {record.trace_id}", ["field", "value"], [[k, "" if v is None else v] for k, v in data.items()])
