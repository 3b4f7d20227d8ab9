"""`exa demo traffic`: bus jobs from the synthetic generator, some pinned to the version that fails.

Thin: draw the jobs, send them through the bus client, count the replies as the retrain trigger does.
Redis that cannot be reached ends the command (``StoreUnavailable``); any other failure is one job's
outcome.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any

import typer

from examlops.cli.output import JsonOption, console, errors_as_exit, load_settings, print_json, print_table
from examlops.core.settings import Settings


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
    async with bus_client(settings) as client:

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
