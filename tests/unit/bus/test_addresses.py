"""The addresses a bridge serves: the catalog's models, and the task map's tasks read again within the TTL."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from examlops.bus.addresses import Addresses
from examlops.bus.hop import ModelHandler
from examlops.core.errors import StoreUnavailable
from examlops.core.settings import HttpSettings
from examlops.registry.catalog import ModelSpec, load_catalog

CATALOG = load_catalog(Path(__file__).resolve().parents[3] / "examlops" / "catalog")
TASK_ADDRESS = uuid.uuid4()


@dataclass(frozen=True)
class Route:
    task: str
    model: str
    alias: str
    address: uuid.UUID
    budget_ms: float | None = None


@dataclass
class InMemoryTaskMap:
    """``TaskAddresses`` over a dict; ``down`` makes it raise as a store that cannot be read."""

    routes_by_task: dict[str, Route] = field(default_factory=dict)
    down: bool = False
    reads: int = 0

    def routes(self) -> list[Route]:
        self.reads += 1
        if self.down:
            raise StoreUnavailable("the task map cannot be read")
        return list(self.routes_by_task.values())


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def addresses(tasks: InMemoryTaskMap | None, clock: Clock, catalog: object = CATALOG) -> Addresses:
    http = httpx.AsyncClient()

    def handler(spec: ModelSpec, task: str | None, budget_ms: float | None) -> ModelHandler:
        return ModelHandler(spec, http, "http://serving", HttpSettings(), clock, task=task, budget_ms=budget_ms)

    return Addresses(catalog, handler, tasks, ttl_s=30.0, clock=clock)  # type: ignore[arg-type]  # a Catalog


async def test_model_addresses_are_served_and_no_task_map_means_no_task_address() -> None:
    served = addresses(None, Clock())
    jpcp = CATALOG.get("JPCP")
    handler = served.handler_of(str(jpcp.seanerbus_uuid))
    assert handler is not None and handler.spec.name == "JPCP" and handler.task is None
    assert not served.due() and await served.refresh() == []
    assert served.handler_of(str(TASK_ADDRESS)) is None


async def test_a_remap_takes_effect_at_the_next_refresh_and_keeps_the_handler_a_job_in_flight_holds() -> None:
    clock = Clock()
    tasks = InMemoryTaskMap({"t": Route("t", "JPCP", "Production", TASK_ADDRESS)})
    served = addresses(tasks, clock)
    assert served.due()
    assert await served.refresh() == [f"examlops:bus:jobs:{TASK_ADDRESS}"]
    in_flight = served.handler_of(str(TASK_ADDRESS))
    assert in_flight is not None and (in_flight.task, in_flight.spec.name) == ("t", "JPCP")
    assert in_flight.url == "http://serving/v1/tasks/t/infer"
    tasks.routes_by_task["t"] = Route("t", "CRCP", "Production", TASK_ADDRESS)
    clock.now += 29
    assert not served.due()  # within the TTL: the copy stands
    clock.now += 1
    assert served.due() and await served.refresh() == []  # not a new address: its group exists
    now = served.handler_of(str(TASK_ADDRESS))
    assert now is not None and now.spec.name == "CRCP"
    assert in_flight.spec.name == "JPCP"  # the job that took it keeps its handler


async def test_an_unchanged_task_keeps_its_handler_and_a_task_of_another_bridges_model_is_not_served() -> None:
    clock = Clock()
    other = uuid.uuid4()
    tasks = InMemoryTaskMap(
        {"t": Route("t", "JPCP", "Production", TASK_ADDRESS), "u": Route("u", "CRCP", "Production", other)}
    )
    served = addresses(tasks, clock, CATALOG.only(["JPCP"]))
    await served.refresh()
    first = served.handler_of(str(TASK_ADDRESS))
    clock.now += 30
    await served.refresh()
    assert served.handler_of(str(TASK_ADDRESS)) is first
    assert served.handler_of(str(other)) is None


async def test_a_task_map_that_cannot_be_read_keeps_the_last_copy_and_is_asked_again_after_the_ttl() -> None:
    clock = Clock()
    tasks = InMemoryTaskMap({"t": Route("t", "JPCP", "Production", TASK_ADDRESS)})
    served = addresses(tasks, clock)
    await served.refresh()
    tasks.down = True
    clock.now += 30
    assert await served.refresh() == []
    assert served.handler_of(str(TASK_ADDRESS)) is not None
    assert not served.due()
    clock.now += 30
    assert served.due()


async def test_a_tasks_default_budget_reaches_its_handler_and_a_changed_budget_applies_at_the_next_refresh() -> None:
    clock = Clock()
    tasks = InMemoryTaskMap({"t": Route("t", "JPCP", "Production", TASK_ADDRESS, budget_ms=50.0)})
    served = addresses(tasks, clock)
    await served.refresh()
    first = served.handler_of(str(TASK_ADDRESS))
    assert first is not None and first.budget_ms == 50.0
    tasks.routes_by_task["t"] = Route("t", "JPCP", "Production", TASK_ADDRESS, budget_ms=20.0)
    clock.now += 31
    await served.refresh()
    now = served.handler_of(str(TASK_ADDRESS))
    assert now is not None and now.budget_ms == 20.0 and first.budget_ms == 50.0
