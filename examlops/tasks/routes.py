"""What a task map holds: the route of one task, and how task names are spelled.

A task names what the caller wants done (``pavement.distress.jpcp``); its route says which model and alias
answer it now, with which adapter (empty until adapters exist), and the task's own bus address: a UUID
made when the task is first mapped and kept across every remap, so a bus caller addresses the task, never
the model behind it.
"""

from __future__ import annotations

import enum
import re
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Final

from examlops.core.errors import InvalidInput
from examlops.core.messages import TASK_NAME_MAX, TASK_NAME_PATTERN

_TASK_NAME = re.compile(TASK_NAME_PATTERN)


class Keep(enum.Enum):
    """The type of ``KEEP``: a remap that leaves the task's default budget as it is."""

    KEEP = "keep"


KEEP: Final = Keep.KEEP

TaskSeed = tuple[str, str, str] | tuple[str, str, str, float | None]
"""What seeding maps: ``(task, model, alias)``, or with the task's default budget in milliseconds."""


@dataclass(frozen=True, slots=True)
class TaskRoute:
    """One task's place in the map: the model and alias that answer it, and its bus address."""

    task: str
    model: str
    alias: str
    address: uuid.UUID
    adapter: str = ""
    changed_at: datetime | None = None
    budget_ms: float | None = None
    """The budget a call to this task gets when it declares none (None: no limit): over HTTP
    (``api/tasks.py``) and over the bus (the bridge applies it from the job's submission)."""


@dataclass(frozen=True, slots=True)
class TaskChange:
    """What one ``TaskMap.map`` did: the route now, and the one it replaced (None for a new task)."""

    route: TaskRoute
    previous: TaskRoute | None


def task_name(raw: str) -> str:
    """The stored spelling of a task name (lower-cased); ``InvalidInput(field="task")`` when it cannot be
    one. The message quotes at most a short prefix of what was given."""
    if not 0 < len(raw) <= TASK_NAME_MAX or not _TASK_NAME.match(raw):
        raise InvalidInput(
            f"task {short(raw)!r} is not a task name (letters, digits, '.', '-', '_'; at most {TASK_NAME_MAX})",
            field="task",
        )
    return raw.lower()


def short(text: str, limit: int = 64) -> str:
    """At most ``limit`` characters of ``text``, marked when cut: error messages never echo more."""
    return text if len(text) <= limit else f"{text[:limit]}..."
