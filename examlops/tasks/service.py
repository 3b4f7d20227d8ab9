"""Changing the task map: seeding it from the catalog, and an operator's remap, each one audited.

``map_task`` contract: the task name must be one (``InvalidInput``), the model must be in the catalog
(``ModelNotFound`` naming the known ones), the alias must be one serving loads: its ``hotset.aliases``
(``aliases``) or the model's default alias, in any case (``InvalidInput`` naming them: a task on any other
would answer every call 404); it defaults to the model's default alias; the
default budget is set (``budget_ms``), cleared (None) or left as it is (``KEEP``, the default; a new task
then has the catalog's default for it, if any); any of those refused, nothing is changed and nothing is
audited. The change is stored first, then appended to
the audit trail as ``task.mapped`` naming who did it (``actor``); when the audit trail cannot be written the
change stays (it is already in SQL) and ``TaskMapped.audited`` says so, so the caller reports it.

``seed_tasks`` maps every task a catalog model lists that the map does not hold yet to that model's
default alias, with the default budget the model's ``task_budgets_ms`` names for it (none otherwise),
and audits each one it created (best effort, as ``"system:catalog"``). A mapped task is never touched:
an operator's remap survives every restart. A task two catalog models list goes to the first in catalog
order (files sorted by name).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from examlops.core.budget import MAX_BUDGET_MS
from examlops.core.errors import InvalidInput
from examlops.core.messages import KNOWN_ALIASES, served_alias, served_aliases
from examlops.registry.catalog import Catalog
from examlops.tasks.ports import TaskMap
from examlops.tasks.routes import KEEP, Keep, TaskChange, TaskRoute, TaskSeed, task_name

log = logging.getLogger(__name__)

AuditHook = Callable[[str, str, Mapping[str, Any]], None]
"""``(event type, subject, data)``: appends one control event to the audit trail, or raises."""

TASK_MAPPED = "task.mapped"


@dataclass(frozen=True, slots=True)
class TaskMapped:
    change: TaskChange
    audited: bool
    audit_error: str | None = None


def event_data(route: TaskRoute, previous: TaskRoute | None, actor: str) -> dict[str, Any]:
    """The data of a ``task.mapped`` event: the route now, what it was, and who changed it."""

    def plain(r: TaskRoute) -> dict[str, Any]:
        return {
            "task": r.task,
            "model": r.model,
            "alias": r.alias,
            "adapter": r.adapter,
            "address": str(r.address),
            "budget_ms": r.budget_ms,
        }

    return {**plain(route), "previous": None if previous is None else plain(previous), "actor": actor}


def map_task(
    task_map: TaskMap,
    catalog: Catalog,
    task: str,
    model: str,
    alias: str | None,
    *,
    actor: str,
    audit: AuditHook,
    budget_ms: float | Keep | None = KEEP,
    aliases: Sequence[str] = KNOWN_ALIASES,
) -> TaskMapped:
    """Point ``task`` at ``model`` and ``alias`` (contract above)."""
    key = task_name(task)
    spec = catalog.get(model)
    served = served_aliases(aliases, spec.default_alias_canonical)
    chosen = served_alias(alias, served, spec.name) if alias and alias.strip() else spec.default_alias_canonical
    if budget_ms is not KEEP and budget_ms is not None and not 0 < budget_ms <= MAX_BUDGET_MS:
        raise InvalidInput(f"the budget must be more than 0 and at most {MAX_BUDGET_MS:.0f} ms", field="budget_ms")
    if budget_ms is KEEP and task_map.get(key) is None:
        budget_ms = spec.budget_of(key)
    change = task_map.map(key, spec.name, chosen, budget_ms=budget_ms)
    try:
        audit(TASK_MAPPED, key, event_data(change.route, change.previous, actor))
    except Exception as exc:
        log.error("task %s was mapped but its audit event was not written: %s", key, exc)
        return TaskMapped(change, audited=False, audit_error=str(exc))
    return TaskMapped(change, audited=True)


def seed_tasks(task_map: TaskMap, catalog: Catalog, audit: AuditHook | None = None) -> list[TaskRoute]:
    """Map the catalog's tasks the map lacks (contract above); the routes created, in catalog order."""
    wanted: dict[str, TaskSeed] = {}
    for spec in catalog:
        for task in spec.tasks:
            budget = spec.budget_of(task)
            wanted.setdefault(task.lower(), (task.lower(), spec.name, spec.default_alias_canonical, budget))
    created = task_map.add_missing(wanted.values())
    for route in created:
        log.info("task %s mapped to %s@%s from the catalog", route.task, route.model, route.alias)
        if audit is not None:
            try:
                audit(TASK_MAPPED, route.task, event_data(route, None, "system:catalog"))
            except Exception as exc:
                log.warning("task %s was seeded but its audit event was not written: %s", route.task, exc)
    return created
