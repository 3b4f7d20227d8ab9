"""`exa promote` and `exa rollback`: move an alias in MLflow and make every serving instance follow.

Thin: parse, call ``examlops.promotion.service``, format. Exit codes come from ``output.py``:
0 every instance serves the new version, whether the alias moved or already pointed at it (then MLflow is not
written); 1 the alias moved but an instance lags, refused the
version or cannot be reached (the message names each one); 2 bad input, such as an alias (``--alias`` or
``--from``) that serving does not load (the message names those it does), refused before anything is read or
written; 3 MLflow unavailable, or the audit trail (Redis, SQL) unavailable before the move (then nothing
moved); 4 a model not in the catalog (checked before MLflow), no such alias or version in MLflow, or nothing
recorded to roll back to.

Each move is audited as intent then outcome (``promotion.service``); a version of the alias that the trail
cannot account for (an earlier intent with no outcome, a move made outside examlops) is printed as a
warning and recorded in the new intent, and the promotion goes on. Every MLflow call is bounded by
``mlflow.timeout_s`` and ``mlflow.max_retries``, so an MLflow server that is down fails the command within
seconds with the alias where it was.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from examlops.cli.output import (
    BAD_INPUT,
    JsonOption,
    checked_urls,
    console,
    err_console,
    errors_as_exit,
    fail,
    load_settings,
    print_json,
    print_table,
)

if TYPE_CHECKING:
    from examlops.promotion.service import PromotionResult

ModelArgument = Annotated[str, typer.Argument(help="Catalog model name (any case).")]
UrlsOption = Annotated[
    list[str] | None,
    typer.Option(
        "--url",
        help="A serving instance to reload (repeatable); default: EXAMLOPS_SERVING__INSTANCES.",
        callback=checked_urls,
    ),
]
TimeoutOption = Annotated[
    float, typer.Option("--timeout", min=1, help="Seconds every instance gets to report the new version.")
]


def register(app: typer.Typer) -> None:
    """Add the top-level commands `promote` and `rollback` to ``app``."""
    app.command("promote")(promote)
    app.command("rollback")(rollback)


def promote(
    model: ModelArgument,
    alias: Annotated[
        str,
        typer.Option("--alias", help="The alias to move: one serving loads (by default Production, Canary, Staging)."),
    ],
    version: Annotated[int | None, typer.Option("--version", min=1, help="The version to point it at.")] = None,
    from_alias: Annotated[
        str | None, typer.Option("--from", help="Point it at the version this alias has (e.g. Canary).")
    ] = None,
    urls: UrlsOption = None,
    timeout: TimeoutOption = 60.0,
    as_json: JsonOption = False,
) -> None:
    """Move an alias in MLflow (the replaced version is kept for `exa rollback`), then reload every serving
    instance and wait until each serves the new version."""
    from examlops.bootstrap import catalog, model_registry
    from examlops.bootstrap.identity import acting_identity, platform_token
    from examlops.bootstrap.moves import audited_moves
    from examlops.identity import Permission
    from examlops.promotion import service as promotion

    if (version is None) == (from_alias is None):
        fail("give exactly one of --version N and --from ALIAS", BAD_INPUT)
    settings = load_settings()
    with errors_as_exit():
        actor = acting_identity(settings, Permission.PROMOTE)
        with audited_moves(settings, actor, "exa promote") as trail:
            result = promotion.promote(
                settings,
                model_registry(settings),
                model,
                alias,
                version=version,
                from_alias=from_alias,
                catalog=catalog(settings),
                instances=urls or None,
                timeout_s=timeout,
                trail=trail,
                token=platform_token(settings),
            )
    _report(result, as_json)


def rollback(
    model: ModelArgument,
    alias: Annotated[str, typer.Option("--alias", help="The alias to move back.")] = "Production",
    urls: UrlsOption = None,
    timeout: TimeoutOption = 60.0,
    as_json: JsonOption = False,
) -> None:
    """Move an alias back to the version its last promotion replaced, then reload every serving instance."""
    from examlops.bootstrap import catalog, model_registry
    from examlops.bootstrap.identity import acting_identity, platform_token
    from examlops.bootstrap.moves import audited_moves
    from examlops.identity import Permission
    from examlops.promotion import service as promotion

    settings = load_settings()
    with errors_as_exit():
        actor = acting_identity(settings, Permission.ROLLBACK)
        with audited_moves(settings, actor, "exa rollback") as trail:
            result = promotion.rollback(
                settings,
                model_registry(settings),
                model,
                alias,
                catalog=catalog(settings),
                instances=urls or None,
                timeout_s=timeout,
                trail=trail,
                token=platform_token(settings),
            )
    _report(result, as_json)


def _report(result: PromotionResult, as_json: bool) -> None:
    if result.unaccounted:
        err_console.print(f"[yellow]warning:[/] the audit trail did not account for this alias: {result.unaccounted}")
    for warning in result.warnings:
        err_console.print(f"[yellow]warning:[/] {warning}", highlight=False)
    if as_json:
        print_json(
            {
                "model": result.model,
                "alias": result.alias,
                "old_version": result.old_version,
                "new_version": result.new_version,
                "instances": list(result.instances),
                "unaccounted": result.unaccounted,
                "warnings": list(result.warnings),
                "nothing_to_do": result.nothing_to_do,
            }
        )
        return
    if result.nothing_to_do:
        console.print(
            f"{result.model}@{result.alias}: already at version {result.new_version}, nothing moved; "
            f"{len(result.instances)} instance(s) serve it",
            highlight=False,
        )
        return
    console.print(
        f"{result.model}@{result.alias}: version {result.old_version or '(unset)'} -> {result.new_version}",
        highlight=False,
    )
    print_table("serving instances", ["instance", "serves"], [[url, result.new_version] for url in result.instances])
