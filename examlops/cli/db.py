"""`exa db upgrade`, `exa db current` and `exa db revision`: the SQL schema under migrations.

Thin: parse, call ``examlops.bootstrap`` (``upgrade_database``, ``database_state``, ``write_migration``),
format. Registered in ``main.py`` as the group ``db``. ``current`` exits 1 unless the database is at the
newest revision; every command exits 3 when the database cannot be reached.
"""

from __future__ import annotations

from typing import Annotated

import typer

from examlops.cli.output import BAD_INPUT, UNWELL, console, errors_as_exit, fail, load_settings, print_json

db_app = typer.Typer(help="The SQL database: upgrade its schema, show its revision.", no_args_is_help=True)

JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON instead of text.")]


@db_app.command("upgrade")
def upgrade(as_json: JsonOption = False) -> None:
    """Create or upgrade the SQL schema to the newest revision (`exa up` runs this too). Safe to run again,
    and from several processes at once; adopts a database made before migrations."""
    from examlops.bootstrap import upgrade_database

    with errors_as_exit():
        done = upgrade_database(load_settings())
    if as_json:
        print_json(done.as_dict())
        return
    before, after = done.before, done.after
    if done.adopted:
        console.print(f"{after.url}: made before migrations, adopted; at revision {after.revision}", highlight=False)
    elif before.revision == after.revision:
        console.print(f"{after.url} is at revision {after.revision}: nothing to do", highlight=False)
    else:
        console.print(f"{after.url} upgraded from {before.revision or 'nothing'} to {after.revision}", highlight=False)


@db_app.command("current")
def current(as_json: JsonOption = False) -> None:
    """Show the database's schema revision and the newest one; exit 1 unless they are the same."""
    from examlops.bootstrap import database_state

    with errors_as_exit():
        state = database_state(load_settings())
    if as_json:
        print_json(state.as_dict())
    else:
        console.print(
            f"{state.url}: revision {state.revision or 'none'}, newest {state.head} ({state.status})", highlight=False
        )
        if state.status != "current":
            console.print(state.problem(), highlight=False)
    if state.status != "current":
        raise typer.Exit(UNWELL)


@db_app.command("revision")
def revision(
    message: Annotated[str, typer.Option("-m", "--message", help="What the migration does, in a few words.")],
) -> None:
    """For maintainers, in a source checkout: write the next migration from what the SQLModel tables add to
    the newest revision (into examlops/db/migrations/versions). Read it before committing it."""
    from examlops.bootstrap import write_migration

    if not message.strip():
        fail("--message must say what the migration does", BAD_INPUT)
    with errors_as_exit():
        path = write_migration(load_settings(), message.strip())
    if path is None:
        console.print("the tables match the newest revision: no migration written")
    else:
        console.print(f"wrote {path}", highlight=False)
