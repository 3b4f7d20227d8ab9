"""Fixtures shared by every test: a clean environment and a private state folder."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from examlops.core.settings import Settings


@pytest.fixture(autouse=True)
def _clean_examlops_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Nothing may depend on the shell: drop every EXAMLOPS_* variable."""
    for name in list(os.environ):
        if name.startswith("EXAMLOPS_"):
            monkeypatch.delenv(name)
    yield


@pytest.fixture
def state_dir(tmp_path: Path) -> Path:
    home = tmp_path / "state"
    home.mkdir()
    return home


@pytest.fixture
def settings(state_dir: Path) -> Settings:
    """Settings with a private state folder; everything else at its default."""
    return Settings(home=state_dir)
