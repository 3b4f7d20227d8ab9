"""`exa predict`: one prediction through the direct API, or with --stream many from a JSONL file.

One prediction goes through the inference port's examlops adapter (``cli/served.py``); --stream posts to
the stream route itself (``_stream`` says why)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any
from urllib.parse import quote

import typer

from examlops.cli.output import (
    BAD_INPUT,
    JsonOption,
    UrlOption,
    errors_as_exit,
    fail,
    load_settings,
    print_json,
    print_table,
)
from examlops.cli.serve import _client, _random_embedding, read_embedding
from examlops.cli.served import REACH_S, served_prediction, served_target
from examlops.core import errors
from examlops.core.budget import MAX_BUDGET_MS
from examlops.core.settings import Settings


def predict(
    node_count: Annotated[
        int | None,
        typer.Option(
            "--node-count", help="Mesh node count, a positive integer (with --stream: for lines without one)."
        ),
    ] = None,
    model: Annotated[
        str | None, typer.Argument(help="Catalog model name (any case); or name a task with --task instead.")
    ] = None,
    task: Annotated[
        str | None,
        typer.Option("--task", help="Ask for a task (e.g. pavement.distress.jpcp): the site picks the model."),
    ] = None,
    alias: Annotated[
        str | None, typer.Option(help="Production, Canary or Staging; default: the traffic split.")
    ] = None,
    version: Annotated[int | None, typer.Option(help="Pin a raw registry version instead of an alias.")] = None,
    embedding_file: Annotated[
        Path | None, typer.Option("--embedding-file", help="JSON list (or plain numbers) of the embedding.")
    ] = None,
    random: Annotated[bool, typer.Option("--random", help="Use a random embedding of the model's length.")] = False,
    instances_file: Annotated[
        Path | None,
        typer.Option("--file", help="With --stream: JSONL, one instance a line ({embedding, node_count, job_id})."),
    ] = None,
    stream: Annotated[
        bool, typer.Option("--stream", help="Stream the instances of --file; print each batch as it is answered.")
    ] = False,
    budget_ms: Annotated[
        float | None,
        typer.Option(
            "--budget-ms",
            min=0.001,
            max=MAX_BUDGET_MS,
            help="Serving's budget in ms (the whole stream's, with --stream): an answer within it, or a refusal.",
        ),
    ] = None,
    url: UrlOption = None,
    as_json: JsonOption = False,
) -> None:
    """One prediction through the direct API (records nothing), for a model or, with --task, for a task;
    with --stream, every instance of --file through the stream route."""
    from examlops.bootstrap import catalog

    if (model is None) == (task is None):
        fail("give exactly one of MODEL and --task T", BAD_INPUT)
    if task is not None and (alias is not None or version is not None):
        fail("--task picks the model and alias itself: --alias and --version go with MODEL only", BAD_INPUT)
    if alias is not None and version is not None:
        fail("give at most one of --alias A and --version N", BAD_INPUT)
    if stream != (instances_file is not None):
        fail("--stream and --file F go together", BAD_INPUT)
    if stream and (embedding_file is not None or random):
        fail("--stream takes its instances from --file: no --embedding-file or --random", BAD_INPUT)
    if not stream and (embedding_file is None) == (not random):
        fail("give exactly one of --embedding-file F and --random", BAD_INPUT)
    if not stream and node_count is None:
        fail("give --node-count N", BAD_INPUT)
    settings = load_settings()
    with errors_as_exit():
        if instances_file is not None:
            _stream(settings, instances_file, node_count, model, task, alias, version, budget_ms, url, as_json)
            return
        target = (
            served_target(task=task)
            if task is not None
            else served_target(model=catalog(settings).get(model or "").name, alias=alias, version=version)
        )
        if embedding_file is not None:
            embedding = read_embedding(embedding_file)
        else:
            # A task's model is the site's choice, so its length is the catalog's default length.
            dim = catalog(settings).get(model).embedding_dim if model else settings.embedding_dim
            embedding = _random_embedding(dim)
        instance = {"embedding": embedding, "node_count": node_count}
        reply = served_prediction(target, instance, url=url, budget_ms=budget_ms)
    if as_json:
        print_json(reply)
    else:
        columns = ["model", "alias", "version", "run_id", "prediction"]
        if task is not None:
            columns.insert(0, "task")
        if reply.get("budget_remaining_ms") is not None:
            columns.append("budget_remaining_ms")
        print_table(None, [c.replace("_", " ") for c in columns], [[reply.get(c) for c in columns]])


def _stream(
    settings: Settings,
    instances_file: Path,
    node_count: int | None,
    model: str | None,
    task: str | None,
    alias: str | None,
    version: int | None,
    budget_ms: float | None,
    url: str | None,
    as_json: bool,
) -> None:
    """The stream route by hand, not the port's ``predict_stream``: the port's chunks carry predictions
    only and a stream that ends early is one error, while this prints each chunk's budget left as it comes
    and the instances answered before the budget ran out."""
    from examlops.bootstrap import catalog
    from examlops.cli.stream import print_stream, read_instances

    body: dict[str, Any] = {}
    if alias:
        body["alias"] = alias
    if version is not None:
        body["version"] = version
    if budget_ms is not None:
        body["budget_ms"] = budget_ms
    path = (
        f"/v1/tasks/{quote(task, safe='')}"
        if task is not None
        else f"/v1/models/{catalog(settings).get(model or '').name}"
    )
    body["instances"] = read_instances(instances_file, node_count)
    wait_s = max(30.0, (budget_ms or 0.0) / 1000.0 + REACH_S)
    try:
        with _client(url) as client:
            print_stream(
                client.stream(f"{path}/stream", json=body, read_timeout_s=wait_s),
                len(body["instances"]),
                as_json=as_json,
            )
    except errors.PayloadTooLarge as exc:  # a stream is one request body; a job takes a file of any size
        raise errors.PayloadTooLarge(
            f"{exc} ({len(body['instances'])} instances in one stream): stream fewer at a time, or submit "
            f"them as an offline job (`exa jobs submit --task T --file {instances_file}`)"
        ) from exc
