"""`exa jobs submit | status | result | cancel | list`: offline jobs on serving, over HTTP with the token.

Thin: parse, call serving's `/v1/jobs`, format. ``submit`` takes the instances as a JSONL file: one under
the state folder is read by serving in place; a small one (at most 1000 instances, ``INLINE_MAX``, and at
most half of ``EXAMLOPS_SERVING__MAX_BODY_BYTES``) goes inline; a larger one is copied into
``<state folder>/jobs/incoming/`` first (serving must share the state folder: the local serving of
`exa up`). Exit codes from ``output.py``: 2 bad input, 3 serving unreachable, 4 no such task or job.
"""

from __future__ import annotations

import shutil
import sys
import uuid
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import quote

import typer

from examlops.cli.client import ServingClient
from examlops.cli.output import (
    BAD_INPUT,
    JsonOption,
    UrlOption,
    console,
    errors_as_exit,
    fail,
    load_settings,
    print_json,
    print_table,
)
from examlops.cli.serve import _client

jobs_app = typer.Typer(
    help="Offline jobs: a task over many instances with a long budget, run in the gaps around interactive calls.",
    no_args_is_help=True,
)

JobId = Annotated[str, typer.Argument(help="The job id `exa jobs submit` printed.")]
INLINE_MAX = 1000
"""As ``jobs.service.INLINE_MAX``: more instances than this go by file."""


def _job_path(job_id: str) -> str:
    return f"/v1/jobs/{quote(job_id, safe='')}"


def _budget_ms(budget_ms: float | None, budget: str | None) -> float:
    """The job's budget from exactly one of the two options, within what serving takes (1 s to 7 days)."""
    from examlops.core.budget import MAX_BUDGET_MS
    from examlops.jobs.model import MIN_BUDGET_MS, parse_duration_ms

    if (budget_ms is None) == (budget is None):
        fail("give exactly one of --budget-ms N and --budget 2h", BAD_INPUT)
    try:
        ms = budget_ms if budget_ms is not None else parse_duration_ms(budget or "")
    except ValueError as exc:
        fail(str(exc), BAD_INPUT)
    if not MIN_BUDGET_MS <= ms <= MAX_BUDGET_MS:
        given = budget if budget is not None else f"{budget_ms:g} ms"
        fail(f"a job's budget is 1s to 7d: {given} is not", BAD_INPUT)
    return ms


def _instances_body(file: Path, state_dir: Path, max_inline_bytes: int) -> dict[str, Any]:
    """``{"file": ...}`` for a file serving can read, else ``{"instances": [...]}`` for a small one."""
    import orjson

    path = file.resolve()
    if not path.is_file():
        fail(f"no file {file}", BAD_INPUT)
    if path.is_relative_to(state_dir):
        return {"file": str(path)}
    with path.open("rb") as source:
        numbered = [(number, line) for number, line in enumerate(source, start=1) if line.strip()]
    if not numbered:
        fail(f"{file} holds no instances", BAD_INPUT)
    lines = [line for _, line in numbered]
    if len(lines) > INLINE_MAX or path.stat().st_size > max_inline_bytes:
        incoming = state_dir / "jobs" / "incoming" / f"{uuid.uuid4().hex}.jsonl"
        incoming.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, incoming)
        return {"file": str(incoming)}
    instances = []
    for number, line in numbered:
        try:
            instances.append(orjson.loads(line))
        except orjson.JSONDecodeError:
            fail(f"{file}:{number} is not JSON (the file takes one JSON object per line)", BAD_INPUT)
    return {"instances": instances}


def _row(job: dict[str, Any]) -> list[Any]:
    progress = job["progress"]
    return [
        job["job_id"],
        job["task"],
        job["state"],
        f"{progress['answered']}/{progress['total']}",
        progress["errors"],
        job["identity"],
        job["error"],
    ]


COLUMNS = ["job", "task", "state", "answered", "errors", "identity", "note"]


@jobs_app.command("submit")
def submit(
    task: Annotated[str, typer.Option("--task", help="The task, e.g. pavement.distress.jpcp.")],
    file: Annotated[Path, typer.Option("--file", help="The instances, JSONL: one {embedding, node_count} a line.")],
    budget_ms: Annotated[
        float | None, typer.Option("--budget-ms", help="The budget in milliseconds (this or --budget).")
    ] = None,
    budget: Annotated[
        str | None, typer.Option("--budget", help="The budget as people write it, 1s to 7d: 90m, 2h (or --budget-ms).")
    ] = None,
    url: UrlOption = None,
    as_json: JsonOption = False,
) -> None:
    """Submit a job: serving answers at once with its id; the work runs in the gaps (`exa jobs status`)."""
    settings = load_settings()
    body = {
        "task": task,
        "budget_ms": _budget_ms(budget_ms, budget),
        **_instances_body(file, settings.state_dir, settings.serving.max_body_bytes // 2),
    }
    with errors_as_exit(), _client(url) as client:
        job = client.request("POST", "/v1/jobs", json=body, ok=(202,))
    if as_json:
        print_json(job)
    else:
        console.print(f"job {job['job_id']} {job['state']}: {job['progress']['total']} instances of {job['task']}")


@jobs_app.command("status")
def status(job_id: JobId, url: UrlOption = None, as_json: JsonOption = False) -> None:
    """A job's state and progress (with --json, its results too once done, when small)."""
    with errors_as_exit(), _client(url) as client:
        job = client.get(_job_path(job_id))
    if as_json:
        print_json(job)
    else:
        print_table(None, COLUMNS, [_row(job)])


@jobs_app.command("result")
def result(
    job_id: JobId,
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Write here; default: stdout.")] = None,
    url: UrlOption = None,
) -> None:
    """The results as JSONL, one line per instance in order (what finished batches recorded so far)."""
    with errors_as_exit(), _client(url) as client:
        if output is None:
            client.download(f"{_job_path(job_id)}/result", sys.stdout.buffer)
            sys.stdout.buffer.flush()
        else:
            written = _download_to(client, f"{_job_path(job_id)}/result", output)
            console.print(f"wrote {written} bytes to {output}")


def _download_to(client: ServingClient, path: str, output: Path) -> int:
    """The reply written to a file beside ``output``, then moved onto it: a failed download (an unknown job,
    a lost connection) leaves ``output`` as it was. A folder that is not there is a usage error (exit 2)."""
    if not output.parent.is_dir():
        fail(f"cannot write {output}: there is no folder {output.parent}", BAD_INPUT)
    partial = output.with_name(f".{output.name}.partial")
    try:
        with partial.open("wb") as sink:
            written = client.download(path, sink)
        partial.replace(output)
    except OSError as exc:
        fail(f"cannot write {output}: {exc.strerror or exc}", BAD_INPUT)
    finally:
        partial.unlink(missing_ok=True)
    return written


@jobs_app.command("cancel")
def cancel(job_id: JobId, url: UrlOption = None, as_json: JsonOption = False) -> None:
    """Cancel a job: it stops before its next batch (an ended job is left as it is)."""
    with errors_as_exit(), _client(url) as client:
        job = client.request("DELETE", _job_path(job_id))
    if as_json:
        print_json(job)
    elif job["state"] == "cancelled":
        console.print(f"job {job['job_id']} cancelled")
    else:
        console.print(f"job {job['job_id']} had already ended ({job['state']}): nothing to cancel")


@jobs_app.command("list")
def list_(url: UrlOption = None, as_json: JsonOption = False) -> None:
    """Your jobs, newest first (every job for an admin or operator)."""
    with errors_as_exit(), _client(url) as client:
        jobs = client.get("/v1/jobs")
    if as_json:
        print_json(jobs)
    elif not jobs:
        console.print("no job: `exa jobs submit --task T --file instances.jsonl --budget 1h`")
    else:
        print_table("offline jobs", COLUMNS, [_row(job) for job in jobs])
