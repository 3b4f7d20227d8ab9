"""`exa drift ...`, `exa flows serve`, `exa retrain` and `exa demo traffic`: the control plane from the shell.

Thin: parse, call ``examlops.monitoring`` / ``examlops.registry`` (through
``examlops.bootstrap.control``) or Prefect, format. Heavy imports (prefect,
evidently, mlflow) happen inside the commands. Exit codes come from
``output.py``.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from examlops.cli.output import console, errors_as_exit, fail, load_settings, print_json, print_table
from examlops.core.settings import Settings

if TYPE_CHECKING:
    from examlops.monitoring.drift_store import StatusRow

JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]

drift_app = typer.Typer(help="Drift of each model's bus traffic (Evidently, K-S p < 0.05).", no_args_is_help=True)
drift_input_app = typer.Typer(help="Drift of the input embeddings (norm, mean, std).", no_args_is_help=True)
drift_app.add_typer(drift_input_app, name="input")
flows_app = typer.Typer(help="The Prefect control plane: the deployments of prefect.yaml.", no_args_is_help=True)


def _status(kind: str, as_json: bool) -> None:
    from examlops.bootstrap import sql_engine
    from examlops.monitoring.drift_store import SqlDriftStore

    settings = load_settings()
    with errors_as_exit():
        rows = SqlDriftStore(sql_engine(settings)).latest(kind)
    if as_json:
        print_json([_status_json(row) for row in rows])
        return
    if not rows:
        console.print("no drift report yet: `exa drift report` runs one now; the drift-report flow every 15 minutes")
        return
    print_table(
        f"{kind} drift (latest report per model)",
        ["model", "version", "drifted", "score", "method", "window", "rows", "report", "when"],
        [
            [
                r.model,
                r.version,
                "DRIFT" if r.drifted else "no",
                f"{r.score:.4g}",
                f"{r.method} p<{r.threshold}",
                f"{r.window_start:%Y-%m-%d %H:%M:%S} .. {r.window_end:%H:%M:%S}",
                r.current_rows,
                r.report_html,
                f"{r.created_at:%Y-%m-%d %H:%M:%S}",
            ]
            for r in rows
        ],
    )


def _status_json(row: StatusRow) -> dict[str, Any]:
    return {
        "model": row.model, "kind": row.kind, "version": row.version, "drifted": row.drifted, "score": row.score,
        "method": row.method, "threshold": row.threshold, "columns": row.columns, "reference": row.reference,
        "reference_rows": row.reference_rows, "current_rows": row.current_rows,
        "window": {"start": row.window_start.isoformat(), "end": row.window_end.isoformat()},
        "report_html": row.report_html, "report_json": row.report_json, "created_at": row.created_at.isoformat(),
    }  # fmt: skip


@drift_app.command("status")
def drift_status(as_json: JsonOption = False) -> None:
    """Per model, prediction drift in the latest report: drifted or not, score (K-S p-value), window, report."""
    _status("prediction", as_json)


@drift_input_app.command("status")
def drift_input_status(as_json: JsonOption = False) -> None:
    """Per model, input-embedding drift (norm, mean, std; two of three columns) in the latest report."""
    _status("input", as_json)


@drift_app.command("report")
def drift_report(
    model: Annotated[str | None, typer.Argument(help="One model (any case); default: every model.")] = None,
    min_rows: Annotated[int, typer.Option("--min-rows", min=2, help="Report only windows this large.")] = 30,
    as_json: JsonOption = False,
) -> None:
    """Run the drift report now, in this process, over the snapshots since each model's last report."""
    from rich.progress import Progress

    from examlops.bootstrap.control import ControlPlane
    from examlops.monitoring.drift import run_drift_report

    plane = ControlPlane(load_settings())
    results: list[dict[str, Any]] = []
    with errors_as_exit():
        names = [plane.catalog.get(model).name] if model else list(plane.catalog.names)
        stages = ("reference", "snapshots", "evidently", "save")
        with Progress(console=console, transient=True, disable=as_json) as progress:
            bar = progress.add_task("drift report", total=len(names) * len(stages))
            for name in names:
                done = 0

                def step(stage: str, name: str = name) -> None:
                    nonlocal done
                    progress.update(bar, advance=1 if done else 0, description=f"{name}: {stage}")
                    done += 1

                report = run_drift_report(
                    name, plane.snapshots, plane.references, plane.drift_store, plane.drift_dir,
                    min_rows=min_rows, on_progress=step,
                )  # fmt: skip
                progress.update(bar, completed=(names.index(name) + 1) * len(stages))
                results.append(_report_json(name, report))
    if as_json:
        print_json(results)
        return
    print_table(
        "drift report",
        ["model", "prediction drift", "p", "input drift", "p", "snapshots", "report"],
        [
            [
                r["model"],
                _yes(r["prediction_drift"]),
                r.get("prediction_score"),
                _yes(r["input_drift"]),
                r.get("input_score"),
                r.get("rows"),
                r.get("report") or f"fewer than {min_rows} new snapshots",
            ]
            for r in results
        ],
    )


def _yes(value: bool | None) -> str:
    return "-" if value is None else ("DRIFT" if value else "no")


def _report_json(model: str, report: Any) -> dict[str, Any]:
    from examlops.flows.drift_report import report_row

    return report_row(model, report)


@flows_app.command("serve")
def flows_serve(
    file: Annotated[
        Path | None, typer.Option("--file", help="The prefect.yaml to serve; default: ./prefect.yaml or the repo's.")
    ] = None,
    wait: Annotated[float, typer.Option("--wait", min=0, help="Seconds to wait for the Prefect API to answer.")] = 120,
) -> None:
    """Serve every deployment of prefect.yaml (drift-report on its schedule, retrain, promote) until Ctrl-C.

    Runs against EXAMLOPS_PREFECT__API_URL, or the Prefect server `exa up` starts."""
    from examlops.flows.wiring import prefect_environment

    settings = load_settings()
    prefect_environment(settings)
    from examlops.flows import deployments

    path = file or deployments.default_path()
    with errors_as_exit():
        loaded = deployments.load_deployments(path)
        _wait_for_prefect(settings.prefect_api_url, wait)
    console.print(f"serving {len(loaded)} deployment(s) of {path} at {settings.prefect_api_url}")
    deployments.serve(path)


def _wait_for_prefect(api_url: str, wait_s: float) -> None:
    """Return once the API answers (exa up starts us beside Prefect); ``DependencyUnavailable`` after ``wait_s``."""
    import time

    import httpx

    from examlops.core.errors import DependencyUnavailable

    deadline = time.monotonic() + wait_s
    while True:
        try:
            if httpx.get(api_url.rstrip("/") + "/health", timeout=2.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() >= deadline:
            raise DependencyUnavailable(f"the Prefect API at {api_url} did not answer within {wait_s:g} s")
        time.sleep(0.5)


def retrain(
    model: Annotated[str, typer.Argument(help="Catalog model name (any case).")],
    alias: Annotated[str, typer.Option("--alias", help="The candidate alias: Canary or Staging.")] = "Canary",
    shift: Annotated[float, typer.Option("--shift", min=0.0, help="Train on synthetic data moved this far.")] = 0.0,
    seed: Annotated[int | None, typer.Option("--seed", help="Seed of the fresh data; default: random.")] = None,
    via_prefect: Annotated[
        bool, typer.Option("--via-prefect", help="Start a run of the retrain deployment instead (needs `exa up`).")
    ] = False,
    as_json: JsonOption = False,
) -> None:
    """Train a candidate on fresh data, compare it with Production, register it and point Canary at it."""
    settings = load_settings()
    if via_prefect:
        _retrain_via_prefect(settings, model, alias, shift, seed, as_json)
        return
    from dataclasses import asdict

    from examlops.bootstrap.control import ControlPlane
    from examlops.flows.retrain import run_retrain

    plane = ControlPlane(settings)
    with errors_as_exit(), console.status(f"retraining {model}") as status:
        result = run_retrain(
            plane, model, reason="exa retrain", candidate_alias=alias, data_shift=shift, seed=seed,
            audit=plane.audit, on_progress=status.update,
        )  # fmt: skip
    if as_json:
        print_json({**asdict(result), "better": result.better})
        return
    prod = "no Production version" if result.production_rmse is None else (
        f"Production (version {result.production_version}) RMSE {result.production_rmse:.4f}"
    )  # fmt: skip
    console.print(
        f"{result.model}: version {result.version} registered (run {result.run_id}); "
        f"{result.alias} {result.replaced_version or '(unset)'} -> {result.version}\n"
        f"held-out RMSE {result.candidate_rmse:.4f} vs {prod}",
        highlight=False,
    )


def _retrain_via_prefect(
    settings: Settings, model: str, alias: str, shift: float, seed: int | None, as_json: bool
) -> None:
    from examlops.flows.wiring import prefect_environment

    prefect_environment(settings)
    from prefect.deployments import run_deployment

    parameters: dict[str, Any] = {"model": model, "reason": "exa retrain", "candidate_alias": alias}
    parameters |= {"data_shift": shift, "seed": seed}
    try:
        run = run_deployment("retrain/retrain", parameters=parameters, timeout=0, as_subflow=False)
    except Exception as exc:  # httpx errors, ObjectNotFound: Prefect or the deployment is not there
        fail(f"Prefect at {settings.prefect_api_url} did not start a retrain run: {type(exc).__name__}: {exc}", 3)
    assert not asyncio.iscoroutine(run)  # run_deployment is sync outside an event loop
    ui = settings.prefect_api_url.removesuffix("/api")
    if as_json:
        print_json({"flow_run_id": str(run.id), "name": run.name, "url": f"{ui}/runs/flow-run/{run.id}"})
    else:
        console.print(f"retrain of {model} started: flow run {run.name} at {ui}/runs/flow-run/{run.id}")


def demo_traffic(
    jobs: Annotated[int, typer.Option("--jobs", min=1, help="How many bus jobs to send.")] = 200,
    drift: Annotated[
        float, typer.Option("--drift", min=0.0, max=1.0, help="Share of the distribution shift (0: none).")
    ] = 0.0,
    fail_rate: Annotated[
        float,
        typer.Option(
            "--fail-rate",
            min=0.0,
            max=1.0,
            help="Share of jobs pinned to alias Staging, the seeded version that fails while predicting "
            "(real model failures: they count toward the retrain trigger).",
        ),
    ] = 0.0,
    model: Annotated[str | None, typer.Option("--model", help="One model; default: every model in turn.")] = None,
    concurrency: Annotated[int, typer.Option("--concurrency", min=1, max=256)] = 16,
    as_json: JsonOption = False,
) -> None:
    """Send bus jobs drawn from the synthetic generator (``--drift`` moves it) so drift reports have traffic.

    ``--fail-rate`` pins that share of the jobs to alias Staging, which ``exa demo seed`` points at a version
    that fails on every row (its log of negative embedding values is NaN): serving answers them 500
    ``inference_failed``, a model failure, so a high enough rate makes the bridge ask for a retrain. The other
    jobs go to the model's default alias and its traffic split."""
    settings = load_settings()
    with errors_as_exit():
        tally = asyncio.run(_send_traffic(settings, jobs, drift, fail_rate, model, concurrency))
    if as_json:
        print_json(tally.to_json())
        return
    print_table(
        "demo traffic",
        ["outcome", "jobs"],
        [
            ["served", tally.served],
            ["failed as model failures (count toward a retrain)", tally.model_failures],
            ["other errors (not model failures)", tally.other_errors],
            *([f"  {code}", n] for code, n in sorted(tally.other_by_code.items())),
        ],
    )
    _traffic_hints(settings, tally)


@dataclass(slots=True)
class _TrafficTally:
    """Replies of ``exa demo traffic``, classified as the retrain trigger does (seed 000's error table)."""

    pinned_to_staging: int = 0
    served: int = 0
    model_failures: int = 0
    other_by_code: dict[str, int] = field(default_factory=dict)

    @property
    def other_errors(self) -> int:
        return sum(self.other_by_code.values())

    def count(self, reply: Mapping[str, Any]) -> None:
        from examlops.monitoring.failures import Outcome, classify

        # The bridge passes serving's body on as it came; the status code itself does not reach a bus client.
        if classify(0, reply) is Outcome.FAILURE:
            self.model_failures += 1
        elif reply.get("error") is None:
            self.served += 1
        else:
            self.other(str(reply.get("code") or "error"))

    def other(self, code: str) -> None:
        self.other_by_code[code] = self.other_by_code.get(code, 0) + 1

    def to_json(self) -> dict[str, Any]:
        return {
            "served": self.served, "model_failures": self.model_failures, "other_errors": self.other_errors,
            "other_errors_by_code": dict(sorted(self.other_by_code.items())),
            "pinned_to_staging": self.pinned_to_staging,
        }  # fmt: skip


def _traffic_hints(settings: Settings, tally: _TrafficTally) -> None:
    failure = settings.failure
    ui = settings.prefect_api_url.removesuffix("/api")
    console.print(
        f"{tally.pinned_to_staging} job(s) were pinned to Staging. Watch the retrain trigger with "
        f"`exa bridge status`: a failure rate of {failure.threshold:g} or more over a model's last "
        f"{failure.window} bus requests asks for a retrain (then {failure.cooldown_s:g} s of cooldown); "
        f"its runs show up under the retrain flow in the Prefect UI, {ui}/runs.",
        highlight=False,
    )
    if tally.other_by_code.get("alias_not_found"):
        console.print("alias not found: run `exa demo seed` to register the Staging version that fails on purpose")
    if tally.other_by_code.get("deadline_exceeded"):
        console.print("no reply in time: is a bridge consuming the bus? `exa up` starts one (`exa bridge start`)")


async def _send_traffic(
    settings: Settings, jobs: int, drift: float, fail_rate: float, model: str | None, concurrency: int
) -> _TrafficTally:
    """Send ``jobs`` jobs, ``round(jobs * fail_rate)`` of them (chosen at random) pinned to alias Staging.

    Raises ``StoreUnavailable`` when Redis cannot be reached; every other failure is one job's outcome.
    """
    from examlops.bootstrap import catalog
    from examlops.bootstrap.bridge import bus_client
    from examlops.core.errors import ExamlopsError, StoreUnavailable
    from examlops.registry.demo import FAULTY_ALIAS
    from examlops.registry.synthetic import make_dataset

    specs = [catalog(settings).get(model)] if model else list(catalog(settings))
    # "--drift 1.0" is the generator's shift 2.0: a move every report notices within a few hundred jobs.
    embeddings, nodes, _ = make_dataset(jobs, dim=specs[0].embedding_dim, seed=random.randrange(2**31), shift=2 * drift)
    # An exact share rather than a coin per job: "--fail-rate 1.0" fails every job, "0.5" exactly half.
    pinned = set(random.sample(range(jobs), round(jobs * fail_rate)))
    tally = _TrafficTally(pinned_to_staging=len(pinned))
    gate = asyncio.Semaphore(concurrency)
    async with bus_client(settings, caller="exa-demo-traffic") as client:

        async def one(i: int) -> None:
            spec = specs[i % len(specs)]
            payload: dict[str, Any] = {"embedding": [float(v) for v in embeddings[i]], "node_count": int(nodes[i])}
            if i in pinned:
                payload["alias"] = FAULTY_ALIAS
            async with gate:
                try:
                    reply = await client.request(spec.seanerbus_uuid, payload, 30.0)
                except StoreUnavailable:
                    raise
                except ExamlopsError as exc:  # DeadlineExceeded: no bridge answered in time
                    tally.other(exc.code)
                    return
            tally.count(reply)

        with console.status(f"sending {jobs} jobs ({len(pinned)} pinned to {FAULTY_ALIAS})"):
            await asyncio.gather(*(one(i) for i in range(jobs)))
    return tally
