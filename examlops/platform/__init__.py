"""The embedded services and their supervisor: what `exa up` starts, watches and stops.

Nothing here imports mlflow or prefect: they run as subprocesses from the venv's bin.
"""

from examlops.platform.process import (
    AlreadyRunning,
    ManagedProcess,
    PortInUse,
    ServiceError,
    ServiceExited,
    ServiceStartFailed,
)
from examlops.platform.redis_server import EmbeddedRedis
from examlops.platform.supervisor import Supervisor, UpState

__all__ = [
    "AlreadyRunning",
    "EmbeddedRedis",
    "ManagedProcess",
    "PortInUse",
    "ServiceError",
    "ServiceExited",
    "ServiceStartFailed",
    "Supervisor",
    "UpState",
]
