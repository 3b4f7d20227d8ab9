"""The composition root: the one place that picks real adapters from the settings.

Nothing here runs at import time; every function builds what it is asked for. Heavy imports (mlflow,
prefect, evidently) stay inside the functions, so the CLI starts fast. Entry points (the CLI, the flows,
an ASGI server) call only these:

- ``serving``: ``ServingProcess`` (``run()``/``close()``), ``serving_app`` (the ASGI app alone),
  ``catalog``, ``model_registry``, ``prepare_platform`` (what `exa up` does first), ``seed_demo_audited``
  (the demo seed with its aliases on the audit trail: `exa up`, `exa demo seed`).
- ``bridge``: ``BridgeProcess`` (``run()``/``close()``), ``bus_client``, ``sync_bus_client``.
- ``clients``: the bus's protocol clients by the settings' switches: ``bus_redis``, ``hop_client``.
- ``recording``: ``RecordingProcess`` (the recorder, ``run()``/``close()``), a bridge's ``RecordingChild``.
- ``identity``: ``identity_resolver`` (tokens to callers, TTL-cached), ``identity_service`` (`exa identity`),
  ``provision_admin`` (`exa up`'s first admin), ``platform_token`` (what `exa` and the bridge present).
- ``control``: ``ControlPlane`` (the flows' adapters), ``control_events`` and ``audit_trail``.
- ``sql``: the SQL engine (it checks the schema and creates no table), ``upgrade_database``,
  ``database_state``, ``table_metadata`` (the one list of table modules), ``write_migration``.
"""

from examlops.bootstrap.bridge import BridgeProcess, bus_client, sync_bus_client
from examlops.bootstrap.clients import bus_redis, hop_client
from examlops.bootstrap.control import ControlPlane, audit_trail, control_events
from examlops.bootstrap.recording import RecordingChild, RecordingProcess, bridge_recording
from examlops.bootstrap.serving import (
    ServingProcess,
    catalog,
    model_registry,
    prepare_platform,
    seed_demo_audited,
    serving_app,
)
from examlops.bootstrap.sql import database_state, sql_engine, table_metadata, upgrade_database, write_migration

__all__ = [
    "BridgeProcess",
    "ControlPlane",
    "RecordingChild",
    "RecordingProcess",
    "ServingProcess",
    "audit_trail",
    "bridge_recording",
    "bus_client",
    "bus_redis",
    "catalog",
    "control_events",
    "database_state",
    "hop_client",
    "model_registry",
    "prepare_platform",
    "seed_demo_audited",
    "serving_app",
    "sql_engine",
    "sync_bus_client",
    "table_metadata",
    "upgrade_database",
    "write_migration",
]
