"""The operators' web dashboard, served by serving at ``/dashboard`` (README.md beside this file)."""

from examlops.dashboard.ports import DashboardSources
from examlops.dashboard.routes import dashboard_router
from examlops.dashboard.site import attach_sources

__all__ = ["DashboardSources", "attach_sources", "dashboard_router"]
