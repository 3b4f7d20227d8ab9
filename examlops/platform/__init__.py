"""The embedded services and their supervisor: what `exa up` starts, watches and stops.

Nothing here imports mlflow or prefect: they run as subprocesses from the venv's bin. Its errors
(``ServiceError`` and below) live in ``examlops.core.errors`` with the rest of the family.
"""

from examlops.platform.process import ManagedProcess
from examlops.platform.redis_server import EmbeddedRedis
from examlops.platform.supervisor import Supervisor
from examlops.platform.up_state import UpState

__all__ = ["EmbeddedRedis", "ManagedProcess", "Supervisor", "UpState"]
