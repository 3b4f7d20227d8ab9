"""The addresses one bridge serves: its catalog models' (fixed at start) and the task map's (refreshed).

Contract:

- A model's address is its catalog ``seanerbus_uuid``; a task's is the address the task map keeps for it.
  A bridge serves the address of every task whose model is in its catalog (the model's input schema checks
  the job), so bridges for disjoint models split the tasks between them as they split the models.
- ``refresh()`` reads the whole task map (off the event loop) and swaps in the new handlers at once; the
  bridge calls it at start and whenever ``due`` says the copy is ``ttl_s`` old. A job takes its address's
  handler when it starts, so a remap changes where new jobs go and never fails one in flight.
- A task's handler carries the task's default budget (``ModelHandler.budgeted``); a changed budget takes
  effect like a remap.
- A task map that cannot be read keeps the last copy (logged); a task mapped to a model that is not in the
  catalog is left to the bridges that have it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping

from examlops.bus import wire
from examlops.bus.hop import ModelHandler
from examlops.bus.ports import TaskAddresses
from examlops.core.errors import ModelNotFound, StoreUnavailable
from examlops.registry.catalog import Catalog, ModelSpec

log = logging.getLogger(__name__)

HandlerFactory = Callable[[ModelSpec, str | None, float | None], ModelHandler]
"""Builds the handler of a model (task None) or of a task that the model answers, with the task's default
budget in milliseconds (None: none)."""


class Addresses:
    def __init__(
        self,
        catalog: Catalog,
        handler: HandlerFactory,
        tasks: TaskAddresses | None,
        *,
        ttl_s: float,
        clock: Callable[[], float],
    ) -> None:
        self.catalog = catalog
        self._handler = handler
        self._tasks = tasks
        self._ttl_s = ttl_s
        self._clock = clock
        self.models: Mapping[str, ModelHandler] = {
            str(spec.seanerbus_uuid): handler(spec, None, None) for spec in catalog
        }
        self.tasks: Mapping[str, ModelHandler] = {}
        self._next_refresh = 0.0

    def handler_of(self, address: str) -> ModelHandler | None:
        """The handler of a model's or a task's address as it is now; None for one this bridge does not serve."""
        return self.models.get(address) or self.tasks.get(address)

    @property
    def addresses(self) -> list[str]:
        return [*self.models, *self.tasks]

    @property
    def streams(self) -> list[str]:
        return [wire.jobs_stream(address) for address in self.addresses]

    def due(self) -> bool:
        return self._tasks is not None and self._clock() >= self._next_refresh

    async def refresh(self) -> list[str]:
        """Read the task map again; the job streams of task addresses new to this bridge (to create groups for)."""
        if self._tasks is None:
            return []
        self._next_refresh = self._clock() + self._ttl_s
        try:
            routes = await asyncio.to_thread(self._tasks.routes)
        except StoreUnavailable as exc:
            log.warning("the task map cannot be read (%s); serving the tasks as last read", exc)
            return []
        fresh: dict[str, ModelHandler] = {}
        for route in routes:
            try:
                spec = self.catalog.get(route.model)
            except ModelNotFound:
                continue
            address = str(route.address)
            current = self.tasks.get(address)
            same = (
                current is not None
                and current.task == route.task
                and current.spec.name == spec.name
                and current.budget_ms == route.budget_ms
            )
            fresh[address] = (
                current if same and current is not None else self._handler(spec, route.task, route.budget_ms)
            )
        added = [wire.jobs_stream(address) for address in fresh if address not in self.tasks]
        for address, handler in fresh.items():
            if address in self.tasks and self.tasks[address] is not handler:
                log.info("task %s (address %s) is now answered by %s", handler.task, address, handler.spec.name)
        self.tasks = fresh
        return added
