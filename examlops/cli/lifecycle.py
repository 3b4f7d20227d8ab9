"""`exa up`, `exa down`, `exa status`: start, stop and inspect every service of one state folder.

Thin: parse, call ``examlops.platform``, format. Nothing heavy is imported at
module level, so `exa --help` stays fast. Exit codes come from ``output.py``:
0 done (and `up` stopped by Ctrl-C or `exa down`), 1 already running / not
running / a service not well, 2 a setting that cannot be used (a taken port),
3 a service that failed to start or died.

``--skip NAME`` (repeatable) leaves a service out of `exa up`, e.g.
``--skip serving`` to run the platform without the serving process.
`exa status` and the document it prints are ``cli.status``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from typing import TYPE_CHECKING, Annotated

import typer

from examlops.cli.output import (
    BAD_INPUT,
    OK,
    UNAVAILABLE,
    UNWELL,
    console,
    err_console,
    errors_as_exit,
    fail,
    load_settings,
    nothing_running,
    print_json,
)
from examlops.cli.status import status, status_document
from examlops.core.settings import Settings

if TYPE_CHECKING:
    from examlops.platform.supervisor import SetupHook

TimeoutOption = Annotated[float, typer.Option("--timeout", help="Seconds to wait.", min=1)]


def register(app: typer.Typer) -> None:
    """Add the top-level commands `up`, `down` and `status` to ``app``."""
    app.command("up")(up)
    app.command("down")(down)
    app.command("status")(status)


def _print_failure(message: str, log_tail: str = "") -> None:
    err_console.print(f"[bold red]error:[/] {message}", highlight=False)
    if log_tail:
        err_console.print("[dim]--- last lines of the log ---[/]")
        err_console.print(log_tail, highlight=False, markup=False)


def _setup_hook() -> SetupHook | None:
    try:
        from examlops.bootstrap import prepare_platform
    except ImportError as exc:
        if exc.name != "examlops.bootstrap":
            raise  # a dependency of bootstrap is broken: that must not pass silently
        console.print("[yellow]examlops.bootstrap.prepare_platform is not available: skipping seeding[/]")
        return None
    return prepare_platform


def up(
    detach: Annotated[bool, typer.Option("--detach", help="Start in the background and return once ready.")] = False,
    no_seed: Annotated[bool, typer.Option("--no-seed", help="Skip preparing the store and demo models.")] = False,
    timeout: TimeoutOption = 180.0,
    skip: Annotated[
        list[str] | None,
        typer.Option("--skip", help="Leave a service out (redis, mlflow, prefect, serving, bridge, flows)."),
    ] = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="With --detach: print the services and their URLs as JSON.")
    ] = False,
) -> None:
    """Start Redis, MLflow, Prefect, serving, the bus bridge and the flows; print their URLs; Ctrl-C stops them all."""
    from examlops.core.errors import AlreadyRunning, PortInUse, ServiceStartFailed
    from examlops.platform.services import SERVICE_NAMES
    from examlops.platform.supervisor import Supervisor

    settings = load_settings()
    skipped = set(skip or ())
    if skipped - set(SERVICE_NAMES):
        fail(
            f"--skip takes {', '.join(SERVICE_NAMES)}, not {', '.join(sorted(skipped - set(SERVICE_NAMES)))}", BAD_INPUT
        )
    if as_json and not detach:
        fail("--json goes with --detach (in the foreground exa up keeps running)", BAD_INPUT)
    if detach:
        _up_detached(settings, no_seed=no_seed, timeout=timeout, skip=sorted(skipped), as_json=as_json)
        return
    with errors_as_exit():
        _first_admin(settings)
    supervisor = Supervisor(
        settings,
        services=[name for name in SERVICE_NAMES if name not in skipped],
        setup=None if no_seed else _setup_hook(),
        console=console,
        ready_timeout=timeout,
    )
    try:
        supervisor.run()
    except AlreadyRunning as exc:
        fail(str(exc), UNWELL)
    except PortInUse as exc:
        fail(str(exc), BAD_INPUT)
    except ServiceStartFailed as exc:  # and ServiceExited
        _print_failure(str(exc), exc.log_tail)
        raise typer.Exit(UNAVAILABLE) from None
    raise typer.Exit(OK)


def _first_admin(settings: Settings) -> None:
    """On first start: the ``admin`` identity, its token in the state folder (0600), for `exa` to use."""
    from examlops.bootstrap import upgrade_database
    from examlops.bootstrap.identity import provision_admin

    upgrade_database(settings)  # the supervisor upgrades too; the second call finds the work done
    if provision_admin(settings):
        console.print(f"created the admin identity; its token is in {settings.admin_token_path} (mode 0600)")
    elif not settings.admin_token_path.exists() and settings.token is None:
        console.print(
            f"[yellow]the admin identity exists but {settings.admin_token_path} is gone:[/] "
            "set EXAMLOPS_TOKEN, or `exa identity rotate admin` to get a new token"
        )


def _cli_module() -> str:
    """The module to re-launch: the one running now when it is ours (tests run lifecycle alone)."""
    spec = getattr(sys.modules["__main__"], "__spec__", None)
    name = getattr(spec, "name", "")
    return name if name.startswith("examlops.cli.") else "examlops.cli.main"


def _up_detached(settings: Settings, *, no_seed: bool, timeout: float, skip: list[str], as_json: bool) -> None:
    from examlops.platform.process import tail
    from examlops.platform.up_state import UpState, url_table

    argv = [sys.executable, "-m", _cli_module(), "up", "--timeout", str(timeout)]
    argv += ["--no-seed"] * no_seed + [arg for name in skip for arg in ("--skip", name)]
    log = settings.log_dir / "up.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    # posix_spawn with setsid: the child leads its own session and outlives us; no Popen to warn at exit.
    pid = os.posix_spawn(
        sys.executable,
        argv,
        # COLUMNS: rich wraps at 80 columns when it writes to a file, which mangles log tails.
        {**os.environ, "EXAMLOPS_HOME": str(settings.state_dir), "COLUMNS": os.environ.get("COLUMNS", "160")},
        file_actions=[
            (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
            (os.POSIX_SPAWN_OPEN, 1, str(log), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644),
            (os.POSIX_SPAWN_DUP2, 1, 2),
        ],
        setsid=True,
    )
    deadline = time.monotonic() + timeout + 120  # the setup hook runs before the readiness clock starts
    try:
        with (err_console if as_json else console).status("starting in the background") as progress:
            while time.monotonic() < deadline:
                if os.waitpid(pid, os.WNOHANG) != (0, 0):
                    _print_failure(f"exa up exited before it was ready (log: {log})", tail(log, 30))
                    raise typer.Exit(UNAVAILABLE)
                state = UpState.read(settings.run_dir)
                if state is not None and state.supervisor_pid == pid:
                    if state.state == "ready" and as_json:
                        print_json({**status_document(state, settings.run_dir), "log": str(log)})
                        return
                    if state.state == "ready":
                        console.print(url_table(state))
                        console.print(f"supervisor pid {pid}; log {log}; `exa down` stops everything")
                        return
                    progress.update(", ".join(f"{r.name}: {r.state}" for r in state.services))
                time.sleep(0.3)
    except KeyboardInterrupt:
        os.kill(pid, signal.SIGTERM)  # it stops whatever it started
        os.waitpid(pid, 0)
        fail("interrupted: the background exa up was stopped", UNWELL)
    os.kill(pid, signal.SIGTERM)
    os.waitpid(pid, 0)
    _print_failure(f"exa up was not ready after {timeout:.0f} s; stopped it (log: {log})", tail(log, 30))
    raise typer.Exit(UNAVAILABLE)


def down(timeout: TimeoutOption = 180.0) -> None:
    """Stop what `exa up` started: SIGTERM its supervisor, which stops each service in turn (serving drains its
    requests in flight first), then end anything left behind: each main process first, then its group.
    The default wait covers every service's stop grace one after another."""
    from examlops.platform.leftovers import group_running, ours, running
    from examlops.platform.process import kill_group, pid_alive
    from examlops.platform.up_state import STATE_FILE, UpState, supervisor_running

    settings = load_settings()
    run_dir = settings.run_dir
    state = UpState.read(run_dir)
    if state is None:
        console.print(nothing_running(settings))
        raise typer.Exit(OK)
    # The lock, not the pid, says whether the supervisor lives: a stale pid may belong to a stranger now.
    if supervisor_running(run_dir):
        with console.status(f"stopping exa up (pid {state.supervisor_pid})"):
            os.kill(state.supervisor_pid, signal.SIGTERM)
            deadline = time.monotonic() + timeout
            while pid_alive(state.supervisor_pid) and time.monotonic() < deadline:
                time.sleep(0.1)
        if pid_alive(state.supervisor_pid):
            err_console.print(f"exa up (pid {state.supervisor_pid}) did not stop in {timeout:.0f} s: killing it")
            os.kill(state.supervisor_pid, signal.SIGKILL)
    leftovers = [r for r in state.services if r.pgid is not None and ours(r.pgid, r.stamp)]
    for record in leftovers:  # the main process first, as the supervisor does: serving drains, then its workers go
        err_console.print(f"{record.name} (group {record.pgid}) was left running: stopping it")
        if record.pid is not None and running(record.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(record.pid, signal.SIGTERM)
    # Each gets the grace its supervisor would have given it (serving's drain), 30 s for a record without one.
    deadline = time.monotonic() + max((r.stop_grace or 30.0 for r in leftovers), default=0.0)
    while any(r.pid is not None and running(r.pid) for r in leftovers) and time.monotonic() < deadline:
        time.sleep(0.1)
    for record in leftovers:
        assert record.pgid is not None
        if group_running(record.pgid):
            kill_group(record.pgid, signal.SIGTERM)
    deadline = time.monotonic() + 10
    while any(group_running(r.pgid) for r in leftovers if r.pgid) and time.monotonic() < deadline:
        time.sleep(0.1)
    for record in leftovers:
        if record.pgid is not None and group_running(record.pgid):
            kill_group(record.pgid, signal.SIGKILL)
    (run_dir / STATE_FILE).unlink(missing_ok=True)
    console.print("stopped")


if __name__ == "__main__":
    _app = typer.Typer(pretty_exceptions_enable=False)
    register(_app)
    _app()
