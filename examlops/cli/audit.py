"""`exa audit verify`, `exa audit tail` and `exa audit archive`: the hash-chained audit trail.

Thin: parse, call what ``bootstrap.control.audit_access`` built, format. Registered in ``main.py`` as the
group ``audit``. ``verify`` exits 1 when the trail is broken, naming the first broken link, or when an
alias's version in MLflow is not what the verified chain last said of it (``promotion.trail.unaccounted``: an
intent with no outcome, a move the trail does not hold; read from the chain's events as they verify, never
from the unsigned per-alias index); with MLflow unreachable (within ``mlflow.timeout_s``) that
second check is skipped and says so. An alias of a catalog model that no alias event names cannot be judged:
it is listed as not covered by the trail (``monitoring.audit.coverage``), which alone does not fail. The checks
and the stored result (``monitoring.audit.verified``, for the dashboard, with the uncovered aliases as notes)
are ``bootstrap.moves.verify_and_record``, the same as the retention flow's.
``archive`` exits 1 when it refuses (a broken chain, another
archiver); both exit 3 when Redis or SQL is down.
"""

from __future__ import annotations

from typing import Annotated

import typer

from examlops.cli.output import UNWELL, JsonOption, console, errors_as_exit, load_settings, print_json, print_table

audit_app = typer.Typer(
    help="The hash-chained audit trail: verify it, show its last events, archive it out of Redis.",
    no_args_is_help=True,
)


@audit_app.command("verify")
def verify(as_json: JsonOption = False) -> None:
    """Walk the chain (archive, then Redis) and the signed checkpoints; name the first broken link, exit 1."""
    from examlops.bootstrap.control import audit_access
    from examlops.bootstrap.moves import verify_and_record
    from examlops.monitoring.audit.coverage import NOT_COVERED

    settings = load_settings()
    with errors_as_exit(), audit_access(settings) as audit:
        outcome = verify_and_record(settings, audit, "exa audit verify")
    report, coverage = outcome.report, outcome.coverage
    aliases, unchecked = list(outcome.aliases.unaccounted), outcome.aliases.unchecked or coverage.unchecked
    if as_json:
        uncovered = [{"model": a.model, "alias": a.alias, "version": a.version} for a in coverage.uncovered]
        print_json(
            {
                **report.to_json(),
                "aliases_unaccounted": aliases,
                "aliases_unchecked": unchecked,
                "aliases_not_covered": uncovered,
            }
        )
    elif report.broken is None:
        console.print(
            f"audit trail intact: {report.events} events ({report.archived} archived, last seq "
            f"{report.last_seq}), {report.checkpoints} signed checkpoints",
            highlight=False,
        )
    else:
        from rich.markup import escape

        broken = report.broken
        where = f" [entry {broken.entry_id}]" if broken.entry_id else ""
        console.print(
            f"[bold red]audit trail broken[/] at seq {broken.seq} ({broken.kind}): {escape(broken.message + where)}",
            highlight=False,
        )
    if not as_json:
        for line in aliases:
            console.print(f"[bold red]alias move not accounted for:[/] {line}", highlight=False)
        for alias in coverage.uncovered:
            console.print(
                f"[yellow]{NOT_COVERED}[/] (no alias event names it, so a move of it cannot be seen): {alias}",
                highlight=False,
            )
        if unchecked:
            console.print(f"[yellow]aliases not checked against MLflow:[/] {unchecked}", highlight=False)
    if report.broken is not None or aliases:
        raise typer.Exit(UNWELL)


@audit_app.command("tail")
def tail(
    n: Annotated[int, typer.Option("-n", "--lines", help="How many of the last events.", min=1)] = 20,
    as_json: JsonOption = False,
) -> None:
    """The last N events of the audit trail, oldest first (from the archive too when Redis holds fewer)."""
    from examlops.bootstrap.control import audit_access
    from examlops.monitoring.audit.verify import tail as tail_trail

    with errors_as_exit(), audit_access(load_settings()) as audit:
        events = tail_trail(audit.store, n, archive=audit.archive)
    if as_json:
        print_json([event.to_json() for event in events])
        return
    rows = []
    for event in events:
        data = event.to_json()
        rows.append([event.seq, data["time"], event.type, event.subject, event.data[:80], event.hash[:12]])
    print_table(f"audit trail: last {len(events)} events", ["seq", "time", "type", "subject", "data", "hash"], rows)


@audit_app.command("archive")
def archive(as_json: JsonOption = False) -> None:
    """Move the events a signed checkpoint covers from Redis to <state>/audit/archive (what retention runs)."""
    from examlops.bootstrap.control import audit_access

    with errors_as_exit(), audit_access(load_settings()) as audit:
        report = audit.archiver.run()
    if as_json:
        print_json(report.to_json())
    elif report.archived:
        console.print(
            f"archived events {report.first_seq}..{report.last_seq} to {report.segment}; "
            f"{report.trimmed} entries trimmed from Redis",
            highlight=False,
        )
    else:
        console.print(
            f"nothing new to archive (archive ends at event {report.archive_last_seq}); "
            f"{report.trimmed} entries trimmed from Redis",
            highlight=False,
        )
