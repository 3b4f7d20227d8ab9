"""How the CLI prints and exits: JSON for scripts, rich tables for people, one exit-code table.

Exit codes live here and nowhere else:

- 0: done
- 1: the thing asked about is not well (not ready, a check failed)
- 2: bad input (usage, a file or value that cannot be used)
- 3: a dependency is unavailable (serving, MLflow, Redis, Prefect)
- 4: not found (model, alias, version)
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Annotated, Any, NoReturn
from urllib.parse import urlsplit

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from examlops.core import errors
from examlops.core.settings import Settings

JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]
"""The ``--json`` flag of every command that prints data."""


def _checked_url(url: str | None) -> str | None:
    """An http(s) URL with a host, else a usage error (exit 2) before any request."""
    if url is not None:
        parsed = urlsplit(url)
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            raise typer.BadParameter(f"{url!r} is not an http(s) URL with a host, such as http://127.0.0.1:18001")
    return url


def checked_urls(urls: list[str] | None) -> list[str] | None:
    """Each of a repeatable ``--url``, as ``_checked_url``."""
    for url in urls or ():
        _checked_url(url)
    return urls


UrlOption = Annotated[
    str | None,
    typer.Option("--url", help="Base URL of serving; default: the local one.", callback=_checked_url),
]
"""The ``--url`` of every command that talks to one serving instance."""

OK, UNWELL, BAD_INPUT, UNAVAILABLE, NOT_FOUND = 0, 1, 2, 3, 4

console = Console()
err_console = Console(stderr=True)


def exit_code_of(error: errors.ExamlopsError) -> int:
    if isinstance(error, errors.InvalidInput | errors.ConfigError):
        return BAD_INPUT
    if isinstance(error, errors.DependencyUnavailable | errors.NotReady | errors.Refused):
        return UNAVAILABLE
    if isinstance(error, errors.NotFound):
        return NOT_FOUND
    return UNWELL


def fail(message: str, code: int = UNWELL) -> NoReturn:
    """Print ``message`` as one error line (as text: brackets in it are not markup) and exit with ``code``."""
    err_console.print(f"[bold red]error:[/] {escape(message)}", highlight=False)
    raise typer.Exit(code)


@contextmanager
def errors_as_exit() -> Iterator[None]:
    """Turn our errors into a one-line message (with the exception's notes) and the exit code of the table above."""
    try:
        yield
    except errors.ExamlopsError as exc:
        # Notes added on the way up (a promotion's "its move_failed audit event was not written either") are
        # part of what the operator must read.
        fail("; ".join([str(exc), *getattr(exc, "__notes__", ())]), exit_code_of(exc))


def token_hint() -> str:
    """What to do about a refused token: where the CLI looks for the admin token `exa up` keeps."""
    return (
        f"set EXAMLOPS_TOKEN, or run `exa up`: without EXAMLOPS_TOKEN the CLI presents the admin token of "
        f"{load_settings().admin_token_path} (EXAMLOPS_HOME names the state folder)"
    )


def nothing_running(settings: Settings) -> str:
    """`exa status` and `exa down` when no `exa up` runs from this state folder."""
    return f"nothing running from the state folder {settings.state_dir} (to look in another, set EXAMLOPS_HOME)"


def load_settings() -> Settings:
    """The settings from the environment; a bad value is a one-line error naming it, with exit 2."""
    from pydantic import ValidationError

    try:
        return Settings()
    except ValidationError as exc:
        first = exc.errors()[0]
        fail(f"invalid setting {'.'.join(str(p) for p in first['loc'])}: {first['msg']}", BAD_INPUT)


def print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")


WHOLE_COLUMNS = frozenset({"trace", "job", "job id", "service", "state"})
"""Columns of ids a user copies into another command, and short words: never wrapped nor cut, whatever the width."""


FOLDED_COLUMNS = frozenset({"URL"})
"""Columns a narrow terminal folds onto more lines, never cuts: a URL is copied whole or not at all."""


def print_table(title: str | None, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    cells = [["" if cell is None else str(cell) for cell in row] for row in rows]
    table = Table(title=title, title_justify="left")
    for i, column in enumerate(columns):
        if column in WHOLE_COLUMNS:
            widest = max([len(column), *(len(row[i]) for row in cells if i < len(row))])
            table.add_column(column, no_wrap=True, min_width=widest)
        elif column in FOLDED_COLUMNS:
            table.add_column(column, overflow="fold")
        else:
            table.add_column(column)
    for row in cells:
        table.add_row(*row)
    console.print(table)
