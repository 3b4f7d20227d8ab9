"""`exa serve ...`: run the serving process and talk to it (the client and embedding helpers `exa predict` uses)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from examlops.cli.client import ServingClient
from examlops.cli.output import (
    BAD_INPUT,
    UNWELL,
    JsonOption,
    UrlOption,
    console,
    errors_as_exit,
    fail,
    load_settings,
    print_json,
    print_table,
)

serve_app = typer.Typer(
    help="Run the serving process (port 18001), check it, and set traffic splits.", no_args_is_help=True
)


def _url(url: str | None) -> str:
    return url or load_settings().serving.local_url


def _client(url: str | None, timeout_s: float = 30.0) -> ServingClient:
    """A client of serving that presents the platform token (EXAMLOPS_TOKEN, else the state folder's)."""
    from examlops.bootstrap.identity import platform_token

    return ServingClient(_url(url), token=platform_token(load_settings()), timeout_s=timeout_s)


@serve_app.command("start")
def start(
    host: Annotated[str | None, typer.Option(help="Interface to bind; default 127.0.0.1.")] = None,
    port: Annotated[int | None, typer.Option(help="Port; default 18001 (EXAMLOPS_SERVING__PORT).")] = None,
    log_level: Annotated[str, typer.Option(help="uvicorn log level.")] = "warning",
    engine: Annotated[
        str | None,
        typer.Option(help="uvicorn or ray (Ray Serve; needs the ray extra); default EXAMLOPS_SERVING__ENGINE."),
    ] = None,
) -> None:
    """Start serving in the foreground: load the hot set from MLflow and answer on HTTP."""
    import logging

    # One line per record, with its time and source: what `exa up` copies into serving.log.
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    settings = load_settings()
    chosen = engine or settings.serving.engine
    if chosen not in ("uvicorn", "ray"):
        fail(f"unknown engine {chosen!r}: uvicorn or ray", BAD_INPUT)
    if chosen == "ray":
        from examlops.bootstrap.ray_serving import RayServingProcess

        with errors_as_exit():
            RayServingProcess(settings, host=host, port=port).run()
        return
    from examlops.bootstrap.serving import ServingProcess

    with errors_as_exit():
        serving = ServingProcess(settings, host=host, port=port, log_level=log_level)
    serving.run()


def _hot_set_rows(models: list[dict[str, Any]]) -> list[list[Any]]:
    rows = []
    for entry in models:
        loaded = entry.get("loaded_at")
        when = time.strftime("%H:%M:%S", time.localtime(loaded)) if loaded else ""
        rows.append(
            [
                entry["model"],
                entry["alias"],
                entry["version"],
                entry["run_id"],
                when,
                entry["state"],
                entry.get("reason"),
            ]
        )
    return rows


@serve_app.command("check")
def check(url: UrlOption = None, as_json: JsonOption = False) -> None:
    """Health of serving and the hot set it has loaded; exits 1 when not ready."""
    with errors_as_exit(), _client(url, timeout_s=10) as client:
        ready = client.get("/readyz", ok=(200, 503))
    if as_json:
        print_json(ready)
    else:
        state = "[green]ready[/]" if ready["ready"] else "[yellow]not ready[/]"
        console.print(f"serving at {_url(url)}: {state}")
        print_table(
            "hot set",
            ["model", "alias", "version", "run id", "loaded", "state", "reason"],
            _hot_set_rows(ready["models"]),
        )
    if not ready["ready"]:
        raise typer.Exit(UNWELL)


@serve_app.command("infer-check")
def infer_check(
    model: Annotated[str | None, typer.Option(help="Model to ask; default: the first in the catalog.")] = None,
    url: UrlOption = None,
    as_json: JsonOption = False,
) -> None:
    """One request end to end through serving's model route; prints the reply and the latency."""
    from examlops.bootstrap import catalog
    from examlops.cli.served import served_prediction, served_target

    settings = load_settings()
    with errors_as_exit():
        spec = catalog(settings).get(model) if model else next(iter(catalog(settings)))
        instance = {
            "embedding": _random_embedding(spec.embedding_dim),
            "node_count": 12,
            "job_id": f"infer-check-{int(time.time())}",
        }
        started = time.perf_counter()
        reply = served_prediction(served_target(model=spec.name), instance, url=url)
        latency_ms = (time.perf_counter() - started) * 1000
    if as_json:
        print_json({**reply, "latency_ms": round(latency_ms, 2)})
    else:
        print_table(
            "infer-check",
            ["model", "alias", "version", "run id", "prediction", "latency"],
            [
                [
                    reply["model"],
                    reply["alias"],
                    reply["version"],
                    reply["run_id"],
                    reply["prediction"],
                    f"{latency_ms:.1f} ms",
                ]
            ],
        )


@serve_app.command("traffic")
def traffic(
    model: Annotated[str, typer.Argument(help="Catalog model name (any case).")],
    production: Annotated[int | None, typer.Option(help="Percent to Production.")] = None,
    canary: Annotated[int | None, typer.Option(help="Percent to Canary.")] = None,
    staging: Annotated[int | None, typer.Option(help="Percent to Staging.")] = None,
    clear: Annotated[bool, typer.Option("--clear", help="Remove the split: all to the default alias.")] = False,
    url: UrlOption = None,
    as_json: JsonOption = False,
) -> None:
    """Show a model's traffic split, or set it (weights sum to 100 and name existing aliases). The change is on
    the audit trail first: when the trail cannot be written the split stays as it was (exit 3). --clear with a
    weight is a usage error (exit 2), before any request."""
    weights = {
        alias: value
        for alias, value in (("Production", production), ("Canary", canary), ("Staging", staging))
        if value is not None
    }
    if clear and weights:
        given = " ".join(f"--{alias.lower()} {value}" for alias, value in weights.items())
        fail(f"--clear removes the split but {given} sets one: give either --clear or the weights", BAD_INPUT)
    with errors_as_exit(), _client(url) as client:
        if weights or clear:
            reply = client.request("PUT", f"/v1/traffic/{model}", json={} if clear else weights)
        else:
            reply = client.get(f"/v1/traffic/{model}")
    if as_json:
        print_json(reply)
    elif reply["weights"]:
        print_table(f"traffic split of {reply['model']}", ["alias", "percent"], list(reply["weights"].items()))
    else:
        console.print(f"{reply['model']}: no split; all traffic to its default alias")


def _random_embedding(dim: int) -> list[float]:
    import numpy as np

    return [float(v) for v in np.random.default_rng().normal(0.0, 1.0 / dim**0.5, size=dim)]


def read_embedding(path: Path) -> list[float]:
    """A JSON list of numbers, or numbers separated by white space or commas."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        fail(f"cannot read {path}: {exc.strerror}", BAD_INPUT)
    try:
        data = json.loads(text)
    except ValueError:
        try:
            return [float(part) for part in text.replace(",", " ").split()]
        except ValueError:
            fail(f"{path} holds neither a JSON list nor plain numbers", BAD_INPUT)
    if isinstance(data, dict) and "embedding" in data:
        data = data["embedding"]
    if not isinstance(data, list):
        fail(f"{path} must hold a JSON list of numbers", BAD_INPUT)
    return data


@serve_app.command("reload")
def reload(
    model: Annotated[str | None, typer.Argument(help="One model (any case); default: every model.")] = None,
    url: UrlOption = None,
    as_json: JsonOption = False,
) -> None:
    """Ask serving to check MLflow for moved aliases now and hot-reload them; prints what changed."""
    with errors_as_exit(), _client(url, timeout_s=120) as client:
        reply = client.request("POST", "/admin/reload", json={"model": model} if model else None)
    if as_json:
        print_json(reply)
    elif not reply["changes"]:
        console.print("every alias in memory already matches MLflow")
    else:
        print_table(
            "reload",
            ["model", "alias", "from", "to", "outcome", "reason"],
            [
                [c["model"], c["alias"], c["old_version"], c["new_version"], c["outcome"], c["reason"]]
                for c in reply["changes"]
            ],
        )
    if any(c["outcome"] in ("refused", "unreachable") for c in reply["changes"]):
        raise typer.Exit(UNWELL)
