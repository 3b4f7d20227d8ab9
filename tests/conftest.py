"""Fixtures shared by every test: a clean environment and a private state folder."""

from __future__ import annotations

import inspect
import os
from collections.abc import Generator, Iterator
from pathlib import Path

import pytest

from examlops.core.settings import Settings
from tests.ports import AWAY_FROM_THE_PLATFORM

# pytest-xdist's workers inherit COLUMNS=80 and LINES=24: rich would fix its consoles' width at import from
# them, and tests that set COLUMNS to read one table row per line would get wrapped rows.
for _name in ("COLUMNS", "LINES"):
    os.environ.pop(_name, None)


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> Generator[None, object, object]:
    """Hide pytest-asyncio's loop policy from looptime's plugin for sync tests.

    looptime's plugin asks that policy for the current loop before every test that has it among its
    fixtures; in a sync test that creates an event loop nobody closes, and pytest reports it as an
    unraisable ResourceWarning at the end of the session.
    """
    is_async = pyfuncitem.get_closest_marker("asyncio") is not None  # pytest-asyncio marks every async test
    if is_async or "event_loop_policy" in inspect.signature(pyfuncitem.function).parameters:
        return (yield)
    policy = pyfuncitem.funcargs.pop("event_loop_policy", None)
    try:
        return (yield)
    finally:
        if policy is not None:
            pyfuncitem.funcargs["event_loop_policy"] = policy


@pytest.fixture(autouse=True)
def _clean_examlops_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Nothing may depend on the shell: drop every EXAMLOPS_* variable; and nothing may reach a platform
    running on this machine: its default ports are moved away (``tests.ports``)."""
    for name in list(os.environ):
        if name.startswith("EXAMLOPS_"):
            monkeypatch.delenv(name)
    for name, value in AWAY_FROM_THE_PLATFORM.items():
        monkeypatch.setenv(name, value)
    yield


@pytest.fixture
def default_ports(monkeypatch: pytest.MonkeyPatch) -> None:
    """For the tests of the settings' defaults: the platform's own ports, as outside the tests."""
    for name in AWAY_FROM_THE_PLATFORM:
        monkeypatch.delenv(name)


THIRD_PARTY_ENVIRONMENT = (
    "PREFECT_HOME",
    "PREFECT_API_URL",
    "PREFECT_SERVER_ANALYTICS_ENABLED",
    "MLFLOW_DISABLE_TELEMETRY",
)
"""What `exa`'s callback and ``flows.wiring.prefect_environment`` set with ``os.environ.setdefault``."""


@pytest.fixture(autouse=True)
def _no_third_party_environment_left(_clean_examlops_env: None) -> Iterator[None]:
    """An in-process `exa` call (CliRunner) points Prefect at its state folder for the rest of the process:
    put those variables back as they were before the test, or a later test's first ``import prefect`` would
    look for its home in a state folder that is not there (the working directory's ``.examlops``)."""
    before = {name: os.environ.get(name) for name in THIRD_PARTY_ENVIRONMENT}
    yield
    for name, value in before.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


@pytest.fixture
def state_dir(tmp_path: Path) -> Path:
    home = tmp_path / "state"
    home.mkdir()
    return home


@pytest.fixture
def settings(state_dir: Path) -> Settings:
    """Settings with a private state folder; everything else at its default."""
    return Settings(home=state_dir)
