"""Tasks: what a caller wants done, mapped by the site to the model and alias that answer it.

See ``README.md``. The port is ``TaskMap`` (``ports``), SQL behind it (``sql.SqlTaskMap``); ``TaskResolver``
answers the hot path from a cached snapshot; ``service`` seeds and changes the map, audited.
"""

from examlops.tasks.ports import TaskMap
from examlops.tasks.resolver import TaskResolver
from examlops.tasks.routes import TaskChange, TaskRoute, task_name

__all__ = ["TaskChange", "TaskMap", "TaskResolver", "TaskRoute", "task_name"]
