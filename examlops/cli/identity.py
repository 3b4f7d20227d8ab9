"""`exa identity add|list|revoke|rotate`: the site's callers and their tokens, in SQL.

Thin: parse, call ``examlops.identity.IdentityService`` (through ``bootstrap.identity``), format. A token is
printed once, by `add` and `rotate`, and never again: the platform keeps only its hash. These commands work
on SQL directly, as `exa db` does; when a platform token is in use (EXAMLOPS_TOKEN or the state folder's
admin.token) its identity must hold ``manage_identities``, and every change is appended to the audit trail
naming that identity (never the token). Exit codes: 2 bad input, 4 unknown identity, 1 a name taken, a
revoked identity rotated or a permission missing, 3 SQL unavailable.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Annotated, Any

import typer

from examlops.cli.output import (
    BAD_INPUT,
    JsonOption,
    console,
    err_console,
    errors_as_exit,
    fail,
    load_settings,
    print_json,
    print_table,
)
from examlops.core.errors import ExamlopsError
from examlops.core.settings import Settings

if TYPE_CHECKING:
    from examlops.identity import Identity, IdentityKey

identity_app = typer.Typer(
    help="Identities: who may call which tasks and models, and take which control actions.", no_args_is_help=True
)
NameArgument = Annotated[str, typer.Argument(help="The identity's name (a robot, an application, a console).")]
_DURATION = re.compile(r"(\d+(?:\.\d+)?)\s*([smhd]?)")
_UNIT_S = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(text: str) -> float:
    """Seconds of ``90``, ``90s``, ``15m``, ``1h``, ``2d``; ``ValueError`` otherwise."""
    match = _DURATION.fullmatch(text.strip().lower())
    if match is None:
        raise ValueError(f"not a duration: {text[:32]!r} (e.g. 90s, 15m, 1h, 2d)")
    return float(match.group(1)) * _UNIT_S[match.group(2)]


def _actor(settings: Settings) -> str:
    from examlops.bootstrap.identity import acting_identity
    from examlops.identity import Permission

    return acting_identity(settings, Permission.MANAGE_IDENTITIES)


def _audit(settings: Settings, type: str, name: str, data: dict[str, Any]) -> None:
    """Append one ``identity.*`` event; a trail that cannot be reached is a warning, the change stays done."""
    from examlops.bootstrap import control_events, sql_engine

    try:
        engine = sql_engine(settings)
        try:
            control_events(settings, engine)(type, name, data)
        finally:
            engine.dispose()
    except ExamlopsError as exc:
        err_console.print(f"[yellow]warning:[/] the change is done but its audit event was not written: {exc}")


def _when(moment: datetime | None) -> str | None:
    return None if moment is None else moment.isoformat(timespec="seconds")


def _identity_json(identity: Identity, keys: Sequence[IdentityKey] = ()) -> dict[str, Any]:
    now = datetime.now(UTC)
    return {
        "name": identity.name,
        "role": identity.role.value,
        "permissions": sorted(p.value for p in identity.permissions),
        "tasks": list(identity.tasks),
        "models": list(identity.models),
        "created": _when(identity.created),
        "revoked": _when(identity.revoked),
        "keys": [
            {
                "key_id": key.key_id,
                "created": _when(key.created),
                "not_after": _when(key.not_after),
                "valid": identity.revoked is None and key.valid_at(now),
            }
            for key in keys
        ],
    }


@identity_app.command("add")
def add(
    name: NameArgument,
    role: Annotated[str, typer.Option("--role", help="caller, operator, bridge or admin.")],
    tasks: Annotated[
        list[str] | None, typer.Option("--task", help="A task it may call (repeatable); none: every task.")
    ] = None,
    models: Annotated[
        list[str] | None, typer.Option("--model", help="A model it may call (repeatable); none: every model.")
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """Add an identity and print its token, once: the platform keeps only a hash of it."""
    from examlops.bootstrap.identity import identity_service
    from examlops.identity import parse_role

    try:
        parsed = parse_role(role)
    except ValueError as exc:
        fail(str(exc), BAD_INPUT)
    settings = load_settings()
    with errors_as_exit():
        actor = _actor(settings)
        with identity_service(settings) as service:
            identity, issued = service.add(name, parsed, tasks=tasks or (), models=models or ())
    _audit(settings, "identity.added", name, {**_public(identity), "key_id": issued.key_id, "actor": actor})
    if as_json:
        print_json({**_identity_json(identity), "key_id": issued.key_id, "token": issued.token})
    else:
        console.print(f"identity {name} ({parsed.value}) added. Its token, shown this once:", highlight=False)
        print(issued.token)  # plain print: no wrapping or markup around a secret someone will copy
    _warn_unknown(settings, identity)  # after the token: nothing here may cost the user the only copy of it


def _warn_unknown(settings: Settings, identity: Identity) -> None:
    """A warning on stderr for each task or model the identity names that the site does not know (yet): a
    typo would leave an identity that can call nothing, and nothing else would say so."""
    from examlops.bootstrap import catalog
    from examlops.bootstrap.tasks import task_map

    try:
        known_models = {spec.name.lower() for spec in catalog(settings)}
        unknown = [f"model {m}" for m in identity.models if m.lower() not in known_models]
        if identity.tasks:
            with task_map(settings) as tasks:
                unknown += [f"task {t}" for t in identity.tasks if tasks.map.get(t) is None]
    except Exception as exc:  # a warning's check: the identity is added whatever happens here
        err_console.print(f"[yellow]warning:[/] could not check its tasks and models against the site: {exc}")
        return
    for what in unknown:
        err_console.print(f"[yellow]warning:[/] no {what} is known here (yet): {identity.name} may call it once it is")


def _public(identity: Identity) -> dict[str, Any]:
    return {"role": identity.role.value, "tasks": list(identity.tasks), "models": list(identity.models)}


@identity_app.command("list")
def list_identities(as_json: JsonOption = False) -> None:
    """Every identity with its role, lists and keys (ids and validity only: never a secret). Like adding and
    revoking, it takes an identity that may manage identities (admin)."""
    from examlops.bootstrap.identity import identity_service

    settings = load_settings()
    with errors_as_exit(), identity_service(settings) as service:
        _actor(settings)  # Forbidden (exit 1) for any other
        rows = [_identity_json(identity, keys) for identity, keys in service.identities()]
    if as_json:
        print_json(rows)
        return
    print_table(
        "identities",
        ["name", "role", "tasks", "models", "valid keys", "revoked"],
        [
            [
                row["name"],
                row["role"],
                ", ".join(row["tasks"]) or "(all)",
                ", ".join(row["models"]) or "(all)",
                ", ".join(
                    k["key_id"] + (f" until {k['not_after']}" if k["not_after"] else "")
                    for k in row["keys"]
                    if k["valid"]
                )
                or "-",
                row["revoked"] or "",
            ]
            for row in rows
        ],
    )


@identity_app.command("revoke")
def revoke(name: NameArgument, as_json: JsonOption = False) -> None:
    """Revoke an identity and every key it has; serving refuses it within EXAMLOPS_AUTH__CACHE_TTL_S."""
    from examlops.bootstrap.identity import identity_service

    settings = load_settings()
    with errors_as_exit():
        actor = _actor(settings)
        with identity_service(settings) as service:
            identity = service.revoke(name)
    _audit(settings, "identity.revoked", name, {"actor": actor})
    if as_json:
        print_json(_identity_json(identity))
        return
    console.print(f"identity {name} revoked at {_when(identity.revoked)}", highlight=False)


@identity_app.command("rotate")
def rotate(
    name: NameArgument,
    grace: Annotated[
        str | None,
        typer.Option("--grace", help="How long the old token stays valid, e.g. 15m, 1h, 2d (default 24h)."),
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """Give an identity a new token (printed once); its old tokens stay valid for the grace period."""
    from examlops.bootstrap.identity import identity_service

    settings = load_settings()
    try:
        grace_s = settings.auth.rotate_grace_s if grace is None else parse_duration(grace)
    except ValueError as exc:
        fail(str(exc), BAD_INPUT)
    with errors_as_exit():
        actor = _actor(settings)
        with identity_service(settings) as service:
            issued, deadline = service.rotate(name, grace_s)
    old_until = _when(deadline)
    _audit(settings, "identity.rotated", name, {"key_id": issued.key_id, "old_valid_until": old_until, "actor": actor})
    if as_json:
        print_json({"name": name, "key_id": issued.key_id, "token": issued.token, "old_valid_until": _when(deadline)})
        return
    console.print(
        f"identity {name} has a new key {issued.key_id}; older tokens stay valid until {_when(deadline)}. "
        "The new token, shown this once:",
        highlight=False,
    )
    print(issued.token)
