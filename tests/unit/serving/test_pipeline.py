"""The pipeline end to end against fakes: batching, routing, grouped predicts, deadlines, reloads, metrics."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from examlops.core.errors import (
    DeadlineExceeded,
    InferenceFailed,
    InvalidInput,
    ModelNotFound,
    NotReady,
    PipelineUnavailable,
    Refused,
    WorkerLost,
)
from examlops.core.messages import InferenceRequest
from examlops.core.settings import AdmissionSettings, BatchSettings, HotSetSettings, PredictSettings, Settings
from examlops.serving.hotset import LOAD_TRIES
from examlops.serving.pipeline import Pipeline
from tests.unit.serving.fakes import (
    DIM,
    FakeClock,
    InMemoryModelSource,
    InMemoryTrafficRules,
    RecordingRuntime,
    make_catalog,
)


@dataclass
class World:
    home: Path
    source: InMemoryModelSource = field(default_factory=InMemoryModelSource)
    runtime: RecordingRuntime = field(default_factory=RecordingRuntime)
    rules: InMemoryTrafficRules = field(default_factory=InMemoryTrafficRules)
    wall: FakeClock = field(default_factory=FakeClock)
    metrics: CollectorRegistry = field(default_factory=CollectorRegistry)
    pipelines: list[Pipeline] = field(default_factory=list)

    def pipeline(
        self,
        *names: str,
        max_wait_ms: float = 20,
        predict: PredictSettings | None = None,
        admission: AdmissionSettings | None = None,
        **kw: Any,
    ) -> Pipeline:
        settings = Settings(
            home=self.home,
            batch=BatchSettings(max_size=32, max_wait_ms=max_wait_ms),
            hotset=HotSetSettings(reload_poll_s=0),
            predict=predict or PredictSettings(),
            admission=admission or AdmissionSettings(),
        )
        catalog = make_catalog(*(names or ("JPCP",)))
        built = Pipeline(
            settings,
            catalog,
            self.source,
            self.rules,
            self.runtime,
            wall=self.wall,
            rng=random.Random(3),
            registry=self.metrics,
            **kw,
        )
        self.pipelines.append(built)
        return built

    def sample(self, name: str, **labels: str) -> float | None:
        return self.metrics.get_sample_value(name, labels)


@pytest.fixture
async def world(tmp_path: Path) -> AsyncIterator[World]:
    w = World(tmp_path)
    w.source.add("JPCP", "1", "Production")
    w.source.add("JPCP", "2", "Canary")
    w.source.add("JPCP", "4")
    yield w
    for built in w.pipelines:
        await built.close()


def req(node_count: int = 3, *, embedding: tuple[float, ...] = (0.5,) * DIM, **kw: Any) -> InferenceRequest:
    return InferenceRequest(model=kw.pop("model", "JPCP"), embedding=embedding, node_count=node_count, **kw)


async def eventually(check: Callable[[], bool], within_s: float = 5.0) -> None:
    async with asyncio.timeout(within_s):
        while not check():  # noqa: ASYNC110 - background work with no event to wait on; polled briefly
            await asyncio.sleep(0.005)


async def test_start_loads_the_hot_set_and_becomes_ready(world: World) -> None:
    pipeline = world.pipeline()
    assert not pipeline.ready
    await pipeline.start()
    assert pipeline.ready
    rows = {(e.alias, e.version, e.state) for e in pipeline.hot_set()}
    assert rows == {("Production", "1", "ready"), ("Canary", "2", "ready"), ("Staging", None, "missing")}


async def test_a_missing_default_alias_keeps_loading_in_the_background(world: World) -> None:
    pipeline = world.pipeline("JPCP", "CRCP", load_retry_s=0.01)
    await pipeline.start()
    assert not pipeline.ready
    with pytest.raises(NotReady):
        await pipeline.infer(req(model="crcp"))
    world.source.add("CRCP", "7", "Production")
    await eventually(lambda: pipeline.ready)
    assert (await pipeline.infer(req(model="crcp"))).version == "7"


async def test_an_alias_that_failed_to_load_at_start_is_retried_behind_so_a_reload_finds_nothing_to_do(
    world: World,
) -> None:
    world.runtime.fail_load.add("JPCP/2")  # Canary: a load that fails once, e.g. a replica busy at start
    pipeline = world.pipeline(load_retry_s=0.01)
    await pipeline.start()
    assert pipeline.ready  # the default alias answers; the failed one is listed with its reason
    [canary] = [e for e in pipeline.hot_set() if e.alias == "Canary"]
    assert canary.state == "error" and canary.reason is not None and "corrupt" in canary.reason
    world.runtime.fail_load.clear()
    await eventually(lambda: any(e.alias == "Canary" and e.state == "ready" for e in pipeline.hot_set()))
    assert await pipeline.reload() == []
    assert (await pipeline.infer(req(alias="Canary"))).version == "2"


async def test_a_new_version_of_an_alias_given_up_at_start_is_retried_behind_the_reload(world: World) -> None:
    world.runtime.fail_load.add("JPCP/2")  # Canary's version is broken for good: given up after its tries
    pipeline = world.pipeline(load_retry_s=0.01)
    await pipeline.start()
    await eventually(lambda: world.runtime.loads.count("JPCP/2") == LOAD_TRIES)
    await asyncio.sleep(0.05)  # the retry task has ended: nothing is left it may try
    assert world.runtime.loads.count("JPCP/2") == LOAD_TRIES
    world.source.add("JPCP", "3")
    world.source.move("JPCP", "Canary", "3")
    world.runtime.fail_load.add("JPCP/3")  # the new version's first tries fail: say a busy worker
    [change] = await pipeline.reload()
    assert (change.alias, change.new_version) == ("Canary", "3") and change.outcome != "swapped"
    world.runtime.fail_load.discard("JPCP/3")
    await eventually(lambda: any(e.alias == "Canary" and e.state == "ready" for e in pipeline.hot_set()))
    assert (await pipeline.infer(req(alias="Canary"))).version == "3"  # no poll, no second reload


async def test_concurrent_requests_to_one_version_share_one_predict_call(world: World) -> None:
    pipeline = world.pipeline(max_wait_ms=50)
    await pipeline.start()
    results = await asyncio.gather(*(pipeline.infer(req(n, job_id=f"j{n}")) for n in range(1, 33)))
    assert world.runtime.predicts == [("JPCP/1", 32)]
    for n, result in enumerate(results, start=1):  # each caller gets its own row back
        assert (result.prediction, result.job_id, result.alias, result.run_id) == (
            1000 + n,
            f"j{n}",
            "Production",
            "run-jpcp-1",
        )
    assert world.sample("examlops_batch_size_count") == 1


async def test_the_split_routes_default_traffic_and_pins_win(world: World) -> None:
    pipeline = world.pipeline()
    await pipeline.start()
    assert pipeline.set_traffic("jpcp", {"production": 0, "CANARY": 100}) == {"Production": 0, "Canary": 100}
    assert pipeline.traffic("JPCP") == {"Production": 0, "Canary": 100}
    assert (await pipeline.infer(req())).alias == "Canary"
    assert (await pipeline.infer(req(alias="production"))).alias == "Canary"  # the default alias gets the split
    pinned = await pipeline.infer(req(version="4"))
    assert (pinned.alias, pinned.version, pinned.prediction) == ("pinned", "4", 4003)


async def test_rows_routed_once_all_go_to_the_alias_the_split_drew(world: World) -> None:
    pipeline = world.pipeline(max_wait_ms=50)
    await pipeline.start()
    pipeline.set_traffic("JPCP", {"Production": 50, "Canary": 50})
    drawn = {await pipeline.route("jpcp") for _ in range(40)}
    assert drawn == {"Production", "Canary"}
    for alias in ("Production", "Canary"):
        rows = await asyncio.gather(*(pipeline.infer(req(n, alias=alias, routed=True)) for n in range(1, 17)))
        assert {(r.alias, r.version) for r in rows} == {(alias, "1" if alias == "Production" else "2")}
    assert await pipeline.route("JPCP", "canary") == "Canary"  # a named alias is taken, not drawn
    with pytest.raises(ModelNotFound):
        await pipeline.route("nope")


async def test_set_traffic_refuses_an_alias_the_model_does_not_have(world: World) -> None:
    pipeline = world.pipeline()
    await pipeline.start()
    with pytest.raises(InvalidInput, match="Staging"):
        pipeline.set_traffic("JPCP", {"Production": 90, "Staging": 10})
    assert world.rules.splits == {}


async def test_a_bad_request_fails_alone_in_its_batch(world: World) -> None:
    pipeline = world.pipeline()
    await pipeline.start()
    outcomes = await asyncio.gather(
        pipeline.infer(req(1)),
        pipeline.infer(req(2, embedding=(1.0,) * 7)),
        pipeline.infer(req(3)),
        return_exceptions=True,
    )
    assert [getattr(o, "prediction", None) for o in outcomes] == [1001, None, 1003]
    assert isinstance(outcomes[1], InvalidInput) and outcomes[1].field == "embedding"
    assert world.runtime.predicts == [("JPCP/1", 2)]


async def test_unknown_models_are_refused_and_counted_without_their_name(world: World) -> None:
    pipeline = world.pipeline()
    await pipeline.start()
    with pytest.raises(ModelNotFound):
        await pipeline.infer(req(model="nope"))
    assert world.sample("examlops_requests_total", model="unknown", alias="other", outcome="not_found") == 1


async def test_a_passed_deadline_is_refused_on_entry(world: World) -> None:
    pipeline = world.pipeline()
    await pipeline.start()
    with pytest.raises(DeadlineExceeded):
        await pipeline.infer(req(deadline=world.wall.now - 1))
    assert world.runtime.predicts == []


async def test_a_deadline_that_passes_while_batching_is_refused_before_prediction(world: World) -> None:
    pipeline = world.pipeline(max_wait_ms=30)
    await pipeline.start()
    late = asyncio.create_task(pipeline.infer(req(deadline=world.wall.now + 1)))
    on_time = asyncio.create_task(pipeline.infer(req(5)))
    await asyncio.sleep(0)
    world.wall.advance(2)  # the caller gives up while the request waits for its batch
    with pytest.raises(Refused) as refused:
        await late
    assert refused.value.reason == "late"
    assert (await on_time).prediction == 1005
    assert world.runtime.predicts == [("JPCP/1", 1)]
    assert world.sample("examlops_requests_total", model="JPCP", alias="Production", outcome="refused") == 1


async def test_a_transport_error_is_retried_on_another_route(world: World) -> None:
    world.runtime.predict_errors = [WorkerLost("worker 2 died")]
    pipeline = world.pipeline()
    await pipeline.start()
    assert (await pipeline.infer(req())).prediction == 1003
    assert len(world.runtime.predicts) == 2


async def test_a_failed_group_predict_fails_every_request_of_the_group_without_retry(world: World) -> None:
    world.runtime.predict_errors = [InferenceFailed("the model raised ValueError")]
    pipeline = world.pipeline()
    await pipeline.start()
    outcomes = await asyncio.gather(*(pipeline.infer(req(n)) for n in range(1, 4)), return_exceptions=True)
    assert all(isinstance(o, InferenceFailed) for o in outcomes)
    assert len(world.runtime.predicts) == 1
    assert world.sample("examlops_requests_total", model="JPCP", alias="Production", outcome="failed") == 3


async def test_retries_stop_after_route_retries(world: World) -> None:
    world.runtime.predict_errors = [WorkerLost("died")] * 3
    pipeline = world.pipeline()
    await pipeline.start()
    with pytest.raises(WorkerLost):
        await pipeline.infer(req())
    assert len(world.runtime.predicts) == 3  # the first try and 2 retries


async def test_a_refused_connection_is_retried_like_a_lost_worker(world: World) -> None:
    world.runtime.predict_errors = [PipelineUnavailable("connection refused")]
    pipeline = world.pipeline()
    await pipeline.start()
    assert (await pipeline.infer(req())).prediction == 1003
    assert len(world.runtime.predicts) == 2


async def test_not_ready_is_not_retried_though_it_is_retryable_for_the_caller(world: World) -> None:
    world.runtime.predict_errors = [NotReady("the predict pool is not started")]
    pipeline = world.pipeline()
    await pipeline.start()
    with pytest.raises(NotReady):
        await pipeline.infer(req())
    assert len(world.runtime.predicts) == 1


async def test_a_request_in_flight_finishes_on_its_version_across_a_reload(world: World) -> None:
    pipeline = world.pipeline()
    await pipeline.start()
    world.runtime.gate, world.runtime.started = asyncio.Event(), asyncio.Event()
    in_flight = asyncio.create_task(pipeline.infer(req()))
    await world.runtime.started.wait()
    world.source.move("JPCP", "Production", "4")
    (change,) = await pipeline.reload("JPCP")
    assert change.outcome == "swapped" and "JPCP/1" not in world.runtime.unloads
    world.runtime.gate.set()
    assert (await in_flight).version == "1"
    await eventually(lambda: "JPCP/1" in world.runtime.unloads)
    assert (await pipeline.infer(req())).version == "4"


async def test_in_flight_counts_the_calls_inside_infer_until_each_is_answered_or_fails(world: World) -> None:
    pipeline = world.pipeline()
    await pipeline.start()
    world.runtime.gate, world.runtime.started = asyncio.Event(), asyncio.Event()
    calls = [asyncio.create_task(pipeline.infer(req())) for _ in range(3)]
    await world.runtime.started.wait()
    assert pipeline.in_flight == 3
    with pytest.raises(InvalidInput):
        await pipeline.infer(req(0, alias="canary"))  # refused on entry: in and out again
    assert pipeline.in_flight == 3
    world.runtime.gate.set()
    await asyncio.gather(*calls)
    assert pipeline.in_flight == 0


async def test_a_refused_new_version_leaves_the_old_one_serving_degraded(world: World) -> None:
    world.runtime.fail_load = {"JPCP/4"}
    pipeline = world.pipeline()
    await pipeline.start()
    world.source.move("JPCP", "Production", "4")
    (change,) = await pipeline.reload()
    assert change.outcome == "refused"
    assert (await pipeline.infer(req())).version == "1"
    production = next(e for e in pipeline.hot_set() if e.alias == "Production")
    assert production.state == "degraded" and "refused" in (production.reason or "")
    assert pipeline.ready


async def test_metrics_carry_model_alias_and_outcome(world: World) -> None:
    pipeline = world.pipeline()
    await pipeline.start()
    await pipeline.infer(req())
    await pipeline.infer(req(alias="canary"))
    with pytest.raises(InvalidInput):
        await pipeline.infer(req(0, alias="canary"))
    assert world.sample("examlops_requests_total", model="JPCP", alias="Production", outcome="ok") == 1
    assert world.sample("examlops_requests_total", model="JPCP", alias="Canary", outcome="ok") == 1
    assert world.sample("examlops_requests_total", model="JPCP", alias="Canary", outcome="invalid") == 1
    assert world.sample("examlops_request_latency_seconds_count", model="JPCP", alias="Canary") == 2
    assert world.sample("examlops_requests_in_flight") == 0
    assert world.sample("examlops_hotset_loaded", model="JPCP", alias="Canary", version="2") == 1


async def test_close_refuses_new_requests(world: World) -> None:
    pipeline = world.pipeline()
    await pipeline.start()
    await pipeline.close()
    assert not pipeline.ready
    with pytest.raises(NotReady):
        await pipeline.infer(req())


async def test_the_pipeline_starts_its_runtime_before_loading_and_closes_it_last(world: World) -> None:
    pipeline = world.pipeline()
    assert not world.runtime.running
    await pipeline.start()
    assert world.runtime.running
    assert world.runtime.loads, "the hot set loaded into the started runtime"
    await pipeline.close()
    assert not world.runtime.running


async def test_control_actions_are_handed_to_the_event_sink_and_a_refusal_only_once(world: World) -> None:
    events: list[tuple[str, str, dict[str, Any]]] = []
    pipeline = world.pipeline(on_event=lambda t, s, d: events.append((t, s, dict(d))))
    await pipeline.start()
    await asyncio.to_thread(pipeline.set_traffic, "jpcp", {"production": 80, "canary": 20}, "console")
    assert events == [("traffic.changed", "JPCP", {"weights": {"Production": 80, "Canary": 20}, "actor": "console"})]

    world.source.move("JPCP", "Production", "4")
    await pipeline.reload(actor="console")
    assert events[-1][:2] == ("model.reloaded", "JPCP")
    assert events[-1][2]["old_version"] == "1" and events[-1][2]["new_version"] == "4"
    assert events[-1][2]["actor"] == "console"

    world.source.add("JPCP", "5")
    world.runtime.fail_load = {"JPCP/5"}
    world.source.move("JPCP", "Production", "5")
    before = len(events)
    await pipeline.reload()
    await pipeline.reload()  # the poll tries the refused version again: no second event
    refusals = [e for e in events[before:] if e[0] == "reload.refused"]
    assert len(refusals) == 1 and refusals[0][2]["new_version"] == "5"
    assert refusals[0][2]["actor"] == "system:reload-poll"


async def test_a_failing_event_sink_never_fails_a_reload(world: World) -> None:
    def broken(type: str, subject: str, data: Any) -> None:
        raise ConnectionError("redis is down")

    pipeline = world.pipeline(on_event=broken)
    await pipeline.start()
    world.source.move("JPCP", "Production", "4")
    changes = await pipeline.reload()  # it stands: a traffic change does not (test_traffic_changes)
    assert [(c.alias, c.new_version) for c in changes] == [("Production", "4")]
    assert {(e.alias, e.version) for e in pipeline.hot_set()} >= {("Production", "4")}
