"""`exa bus send` and `exa bridge start`: talk over the Redis bus, and run a bridge.

Thin: parse, call ``examlops.bus.client`` / ``examlops.bus.bridge``, format.
Registered in ``main.py`` as the groups ``bus`` and ``bridge``. Exit codes come
from ``output.py``: an error reply exits with the code of the error its ``code`` names.
"""

from __future__ import annotations

import logging
import socket
import uuid
from pathlib import Path
from typing import Annotated, Any

import typer

from examlops.cli.output import (
    BAD_INPUT,
    UNAVAILABLE,
    JsonOption,
    errors_as_exit,
    exit_code_of,
    fail,
    print_json,
    print_table,
)
from examlops.core import errors
from examlops.core.settings import Settings

bus_app = typer.Typer(help="Send jobs over the Redis bus to a model's address (its seanerbus_uuid).")
bridge_app = typer.Typer(help="The bus bridge: consumes jobs, calls serving, replies exactly once.")


@bus_app.callback(no_args_is_help=True)
def _bus() -> None:
    """Send jobs over the Redis bus to a model's address (its seanerbus_uuid)."""


@bridge_app.callback(no_args_is_help=True)
def _bridge() -> None:
    """The bus bridge: consumes jobs, calls serving, replies exactly once."""


def _error_of(body: dict[str, Any]) -> errors.ExamlopsError:
    """The error class an error reply's ``code`` names (``ExamlopsError`` when none does)."""
    return errors.error_of(body.get("code"), str(body.get("error")))


@bus_app.command("send")
def send(
    model: Annotated[
        str | None, typer.Argument(help="A catalog model name (any case) or its bus UUID; or give --task.")
    ] = None,
    *,
    task: Annotated[
        str | None, typer.Option("--task", help="Send to the task's bus address (the site maps it to a model).")
    ] = None,
    node_count: Annotated[int, typer.Option("--node-count", help="Mesh node count, a positive integer.")],
    embedding_file: Annotated[
        Path | None, typer.Option("--embedding-file", help="JSON list (or plain numbers) of the embedding.")
    ] = None,
    random: Annotated[bool, typer.Option("--random", help="Use a random embedding of the model's length.")] = False,
    alias: Annotated[str | None, typer.Option(help="Production, Canary or Staging; default: the split.")] = None,
    timeout: Annotated[
        float,
        typer.Option(
            help="Seconds the whole call may take: sending the job, then waiting for the reply (the job's "
            "deadline). No reply in time, or a Redis that does not answer: exit 3 once it ran out (closing the "
            "connection takes at most a few seconds more).",
            min=0.1,
        ),
    ] = 30.0,
    budget_ms: Annotated[
        float | None,
        typer.Option(
            "--budget-ms",
            help="How long the caller can wait, in milliseconds from now (the earlier of it and --timeout wins). "
            "A job that cannot be answered within it is refused at once (exit 3, with the estimate). "
            "Unset: a task's default budget, else none.",
            min=0.001,
        ),
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """Send one job to a model's or a task's bus address and print the reply; exits non-zero on an error reply,
    3 when no reply came within --timeout or Redis did not take the job.

    A refusal (no placement could meet the budget) is a normal outcome: fall back, do not retry at once.

    Signs with the bus key of EXAMLOPS_TOKEN, or of the admin token `exa up` keeps in the state folder.
    """
    from examlops.bootstrap import catalog
    from examlops.bootstrap.bridge import sync_bus_client, task_route
    from examlops.bus.client import RefusedJob
    from examlops.cli.serve import _random_embedding, read_embedding

    if (embedding_file is None) == (not random):
        fail("give exactly one of --embedding-file F and --random", BAD_INPUT)
    if (model is None) == (task is None):
        fail("give exactly one of a MODEL and --task T", BAD_INPUT)
    if task is not None and alias:
        fail("--alias is for a model; the task map names a task's alias", BAD_INPUT)
    settings = Settings()
    with errors_as_exit():
        models = catalog(settings)
        if task is not None:
            route = task_route(settings, task)
            address, spec = route.address, models.get(route.model)
        else:
            try:
                spec = models.by_uuid(uuid.UUID(str(model)))
            except ValueError:
                spec = models.get(str(model))
            address = spec.seanerbus_uuid
        embedding = read_embedding(embedding_file) if embedding_file else _random_embedding(spec.embedding_dim)
        payload: dict[str, Any] = {"embedding": embedding, "node_count": node_count}
        if alias:
            payload["alias"] = alias
        with sync_bus_client(settings) as client:
            try:
                reply = client.request(address, payload, timeout, budget_ms=budget_ms)
            except RefusedJob as refused:
                reply = refused.reply
            except errors.DeadlineExceeded as exc:  # the job is on its stream and no bridge answered in time
                fail(f"{exc}: no bridge answered (is one running for this address?)", UNAVAILABLE)
    if as_json:
        print_json(reply)
    elif reply.get("error") is None:
        print_table(
            f"bus reply from {address}",
            ["task", "model", "alias", "version", "run id", "prediction", "job id", "budget ms", "left ms"],
            [
                [
                    reply.get(k)
                    for k in (
                        "task",
                        "model",
                        "alias",
                        "version",
                        "run_id",
                        "prediction",
                        "job_id",
                        "budget_ms",
                        "budget_remaining_ms",
                    )
                ]
            ],
        )
    if reply.get("error") is not None:
        error = _error_of(reply)
        if as_json:
            raise typer.Exit(exit_code_of(error))
        if reply.get("code") == errors.Refused.code:
            fail(
                f"refused ({reply.get('refused')}): estimated {reply.get('estimate_ms')} ms against a budget of "
                f"{reply.get('budget_ms')} ms; retry after {reply.get('retry_after_s')} s at the earliest "
                f"(job {reply.get('job_id')})",
                exit_code_of(error),
            )
        fail(f"{reply['error']} (code {reply.get('code')}, job {reply.get('job_id')})", exit_code_of(error))


@bridge_app.command("start")
def start(
    concurrency: Annotated[
        int | None, typer.Option(help="Jobs served at once by this bridge (EXAMLOPS_BUS__CONCURRENCY, 64).", min=1)
    ] = None,
    log_level: Annotated[str, typer.Option(help="Python log level.")] = "info",
    record: Annotated[
        bool,
        typer.Option(
            "--record/--no-record",
            help="Record a drift snapshot and an audit event per served job (the default). --no-record is for "
            "measuring and debugging only: served jobs then leave no snapshot, no audit event and no failure count.",
        ),
    ] = True,
    models: Annotated[
        list[str] | None,
        typer.Option(
            "--model",
            help="Serve only this catalog model (repeat for several; case-insensitive). By default the bridge "
            "serves every catalog model. Jobs for a model no live bridge serves get a model_not_found reply.",
        ),
    ] = None,
) -> None:
    """Run one bridge in the foreground until SIGTERM or Ctrl-C: one handler per catalog model UUID."""
    from examlops.bootstrap.bridge import BridgeProcess

    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    settings = Settings()
    if concurrency is not None:
        settings = settings.model_copy(update={"bus": settings.bus.model_copy(update={"concurrency": concurrency})})
    with errors_as_exit():
        bridge = BridgeProcess(settings, models=models, record=record)
        try:
            bridge.run()
        except errors.StoreUnavailable as exc:
            hint = "start it with `exa up`" if settings.redis_owned else "check EXAMLOPS_REDIS__URL"
            fail(f"{exc}; {hint}", UNAVAILABLE)


@bridge_app.command("recorder")
def recorder(
    log_level: Annotated[str, typer.Option(help="Python log level.")] = "info",
) -> None:
    """Drain the records stream in the foreground until SIGTERM or Ctrl-C (every bridge runs one already).

    Writes each served bus job's drift snapshot and audit event; useful to catch up a backlog with no bridge
    running, or to add a recorder beside the bridges' own.
    """
    import os
    import signal

    from examlops.bootstrap import RecordingProcess

    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    settings = Settings()
    process = RecordingProcess(settings, f"{socket.gethostname()}-{os.getpid()}-cli")
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda _signum, _frame: process.close())
    with errors_as_exit():
        process.run()
