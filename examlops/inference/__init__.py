"""The typed inference port (seed 002): call a model by a spec, whatever serves it.

Importable without the server's dependencies: nothing here imports fastapi, mlflow, prefect, redis or
SQL at import time (an adapter that needs a library imports it when built).
"""

from examlops.inference.capture import Capture
from examlops.inference.context import Criticality, bind_criticality, bind_trace_id, deadline_in
from examlops.inference.errors import FeatureUnsupported, InferenceError, Kind
from examlops.inference.port import InferencePort
from examlops.inference.ports import Adapter, Call, Capabilities
from examlops.inference.spec import InferenceSpec
from examlops.inference.wiring import Inference, Wiring, register_adapter

__all__ = [
    "Adapter",
    "Call",
    "Capabilities",
    "Capture",
    "Criticality",
    "FeatureUnsupported",
    "Inference",
    "InferenceError",
    "InferencePort",
    "InferenceSpec",
    "Kind",
    "Wiring",
    "bind_criticality",
    "bind_trace_id",
    "deadline_in",
    "register_adapter",
]
