"""`exa status`'s word on one service: the supervisor's state wins over a probe that answers before it looked."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from examlops.cli import status
from examlops.cli.main import app
from examlops.platform import process
from examlops.platform.up_state import ServiceRecord


def _record(state: str) -> ServiceRecord:
    return ServiceRecord(
        name="redis", title="Redis", url="redis://127.0.0.1:1", state=state, pid=os.getpid(), health_url="http://h"
    )


@pytest.mark.parametrize(
    ("state", "healthy", "supervisor_up", "expected", "alive"),
    [
        ("starting", True, True, "starting", True),  # restarted, answering, not yet seen ready by the supervisor
        ("starting", False, True, "starting", True),
        ("running", True, True, "running", True),
        ("running", False, True, "unhealthy", True),
        ("restarting", True, True, "restarting", True),
        ("starting", True, False, "running", True),  # no supervisor to ask: the probe is all there is
        ("running", False, True, "restarting", False),  # died since the supervisor looked: it restarts it
        ("running", False, False, "stopped", False),  # no supervisor: nothing restarts it
    ],
)
def test_a_service_state_is_the_supervisors_word_then_its_probe(
    monkeypatch: pytest.MonkeyPatch, state: str, healthy: bool, supervisor_up: bool, expected: str, alive: bool
) -> None:
    monkeypatch.setattr(process, "probe", lambda url: healthy)
    record = _record(state)
    record.pid = os.getpid() if alive else None
    record.pgid, record.stamp = None, None
    assert status._service_status(record, supervisor_up)["state"] == expected


@pytest.mark.parametrize(("command", "code"), [("status", 1), ("down", 0)])
def test_with_nothing_up_the_state_folder_looked_in_is_named(tmp_path: Path, command: str, code: int) -> None:
    result = CliRunner().invoke(app, [command], env={"EXAMLOPS_HOME": str(tmp_path / "state")})
    assert result.exit_code == code
    said = " ".join(result.output.split())
    assert f"nothing running from the state folder {tmp_path / 'state'} (to look in another, set EXAMLOPS_HOME)" in said
