"""`exa audit verify` and `exa audit tail`: check the hash-chained audit trail, show its last events.

Thin: parse, call ``examlops.monitoring.audit``, format. Registered in ``main.py`` as the group ``audit``.
``verify`` exits 1 when the trail is broken, naming the first broken link; 3 when Redis or SQL is down.
"""

from __future__ import annotations

from typing import Annotated

import typer

from examlops.cli.output import UNWELL, console, errors_as_exit, load_settings, print_json, print_table

audit_app = typer.Typer(help="The hash-chained audit trail: verify it, show its last events.", no_args_is_help=True)

JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]


@audit_app.command("verify")
def verify(as_json: JsonOption = False) -> None:
    """Walk the chain and the signed checkpoints; name the first broken link and exit 1 when there is one."""
    from examlops.adapters.redis import connect
    from examlops.bootstrap import sql_engine
    from examlops.monitoring.audit_store import SqlCheckpointStore
    from examlops.monitoring.audit_verify import verify as verify_trail

    settings = load_settings()
    with errors_as_exit():
        client = connect(settings.redis_url)
        engine = sql_engine(settings)
        try:
            report = verify_trail(client, settings.secret.get_secret_value().encode(), SqlCheckpointStore(engine))
        finally:
            client.close()
            engine.dispose()
    if as_json:
        print_json(report.to_json())
    elif report.broken is None:
        console.print(
            f"audit trail intact: {report.events} events (last seq {report.last_seq}), "
            f"{report.checkpoints} signed checkpoints",
            highlight=False,
        )
    else:
        broken = report.broken
        console.print(
            f"[bold red]audit trail broken[/] at seq {broken.seq} ({broken.kind}): {broken.message}"
            + (f" [entry {broken.entry_id}]" if broken.entry_id else ""),
            highlight=False,
        )
    if report.broken is not None:
        raise typer.Exit(UNWELL)


@audit_app.command("tail")
def tail(
    n: Annotated[int, typer.Option("-n", "--lines", help="How many of the last events.", min=1)] = 20,
    as_json: JsonOption = False,
) -> None:
    """The last N events of the audit trail, oldest first."""
    from examlops.adapters.redis import connect
    from examlops.monitoring.audit_verify import tail as tail_trail

    settings = load_settings()
    with errors_as_exit():
        client = connect(settings.redis_url)
        try:
            events = tail_trail(client, n)
        finally:
            client.close()
    if as_json:
        print_json([event.to_json() for event in events])
        return
    rows = []
    for event in events:
        data = event.to_json()
        rows.append([event.seq, data["time"], event.type, event.subject, event.data[:80], event.hash[:12]])
    print_table(f"audit trail: last {len(events)} events", ["seq", "time", "type", "subject", "data", "hash"], rows)
