"""The Open Inference Protocol (KServe V2) on the serving tier: ``v2_routes`` is what ``create_app`` includes."""

from examlops.api.v2.routes import v2_routes

__all__ = ["v2_routes"]
