"""The fault suite's switches: every test here is marked ``faults``; ``EXAMLOPS_FAULTS=long`` picks the long runs.

The variable is read at import, before the autouse fixture of ``tests/conftest.py`` clears ``EXAMLOPS_*`` from
the environment of each test.
"""

from __future__ import annotations

import os

import pytest

LONG = os.environ.get("EXAMLOPS_FAULTS", "short").strip().lower() == "long"
"""True under `make faults`: each scenario holds its load and faults longer (see tests/faults/README.md)."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    here = os.path.dirname(__file__)
    for item in items:
        if str(item.path).startswith(here):
            item.add_marker(pytest.mark.faults)
