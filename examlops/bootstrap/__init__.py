"""The composition root: the one place that picks real adapters from the settings.

Nothing here runs at import time; every function builds what it is asked for.
Heavy imports (mlflow, prefect, evidently) stay inside the functions, so the CLI starts fast.

- ``sql``: the SQL engine.
- ``serving``: the serving app; ``prepare_platform`` for `exa up`.
- ``control``: the audit trail of control actions.
- ``recording``: what the bridge records through, and the recording child.
"""

from examlops.bootstrap.control import audit_trail, control_events
from examlops.bootstrap.recording import bridge_recording, redis_recorder, run_recording_process
from examlops.bootstrap.serving import catalog, model_registry, prepare_platform, serving_app
from examlops.bootstrap.sql import sql_engine

__all__ = [
    "audit_trail",
    "bridge_recording",
    "catalog",
    "control_events",
    "model_registry",
    "prepare_platform",
    "redis_recorder",
    "run_recording_process",
    "serving_app",
    "sql_engine",
]
