"""What a SIGKILLed ``exa up`` leaves behind: its ``up.json`` and the process groups it started.

Real processes in their own sessions stand in for the services; ``up.json`` is written as the dead
supervisor left it. The next ``exa up`` must refuse while one of those groups is still the service's, and
``exa down`` must end it; a group whose id now belongs to another process (after a reboot, or handed out
again) is neither a reason to refuse nor ever signalled.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from examlops.cli.main import app as exa
from examlops.core.errors import AlreadyRunning
from examlops.core.settings import Settings
from examlops.platform.leftovers import ours, stamp
from examlops.platform.process import group_alive
from examlops.platform.up_state import STATE_FILE, ServiceRecord, UpState, claim

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

SLEEPER = [sys.executable, "-c", "import time; time.sleep(120)"]


@pytest.fixture
def spawned() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Processes the test starts, each leading a session of its own; any left are killed at the end."""
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for process in started:
        if process.poll() is None:
            process.kill()
        process.wait(timeout=10)


def sleeper(spawned: list[subprocess.Popen[bytes]]) -> subprocess.Popen[bytes]:
    """A service's main process. It is reaped as soon as it ends, as init reaps the orphans of a killed
    supervisor: a zombie would still count as alive."""
    process = subprocess.Popen(SLEEPER, start_new_session=True)
    spawned.append(process)
    threading.Thread(target=process.wait, daemon=True).start()
    return process


def dead_supervisor(home: Path, *records: ServiceRecord) -> Path:
    """``up.json`` of a supervisor that no longer runs (a pid that exited), naming ``records``."""
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    run_dir = Settings(home=home).run_dir
    UpState(supervisor_pid=gone.pid, state_dir=str(home), state="ready", services=list(records)).write(run_dir)
    return run_dir


def record(name: str, process: subprocess.Popen[bytes], recorded: str | None) -> ServiceRecord:
    return ServiceRecord(name=name, title=name, url="", pid=process.pid, pgid=process.pid, stamp=recorded)


def down(home: Path) -> str:
    result = CliRunner(env={"EXAMLOPS_HOME": str(home)}).invoke(exa, ["down"])
    assert result.exit_code == 0, result.output
    return result.output


def until_gone(pgid: int, timeout_s: float = 15.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while group_alive(pgid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not group_alive(pgid)


def test_a_service_left_by_a_killed_supervisor_blocks_the_next_up_until_down_ends_it(
    tmp_path: Path, spawned: list[subprocess.Popen[bytes]]
) -> None:
    service = sleeper(spawned)
    run_dir = dead_supervisor(tmp_path, record("serving", service, stamp(service.pid)))

    with pytest.raises(AlreadyRunning, match=r"ended without stopping serving; run `exa down`"):
        claim(run_dir, tmp_path)
    assert (run_dir / STATE_FILE).exists()  # refused: the record stays for `exa down`

    assert "serving (group" in down(tmp_path)
    assert until_gone(service.pid)
    assert not (run_dir / STATE_FILE).exists()
    claim(run_dir, tmp_path).close()


def test_a_group_whose_leader_exited_is_still_the_services(
    tmp_path: Path, spawned: list[subprocess.Popen[bytes]]
) -> None:
    # The leader starts a member of its group, which outlives it.
    leader = subprocess.Popen(
        [sys.executable, "-c", f"import subprocess; subprocess.Popen({SLEEPER!r})"], start_new_session=True
    )
    spawned.append(leader)
    recorded = stamp(leader.pid)
    leader.wait(timeout=30)
    assert group_alive(leader.pid)
    assert ours(leader.pid, recorded)
    dead_supervisor(tmp_path, record("bridge", leader, recorded))

    down(tmp_path)
    assert until_gone(leader.pid)


@pytest.mark.parametrize("stranger", ["another start", "another boot"])
def test_a_group_id_now_held_by_another_process_is_never_signalled(
    tmp_path: Path, spawned: list[subprocess.Popen[bytes]], stranger: str
) -> None:
    other = sleeper(spawned)
    boot, _, ticks = (stamp(other.pid) or "").partition(":")
    assert boot and ticks
    # What the dead supervisor stamped: the same group id, but a process that started earlier, or before
    # the machine last booted.
    recorded = f"{boot}:{int(ticks) - 100}" if stranger == "another start" else f"{'0' * len(boot)}:{ticks}"
    run_dir = dead_supervisor(tmp_path, record("mlflow", other, recorded))

    assert not ours(other.pid, recorded)
    claim(run_dir, tmp_path).close()  # nothing of the dead supervisor's runs: the next up may start
    assert not (run_dir / STATE_FILE).exists()

    dead_supervisor(tmp_path, record("mlflow", other, recorded))
    down(tmp_path)
    assert group_alive(other.pid)  # the stranger was left alone


def test_a_record_without_a_stamp_is_taken_as_the_services(
    tmp_path: Path, spawned: list[subprocess.Popen[bytes]]
) -> None:
    """An ``up.json`` written before stamps: a live group is ended as it always was."""
    service = sleeper(spawned)
    dead_supervisor(tmp_path, record("redis", service, None))
    down(tmp_path)
    assert until_gone(service.pid)


def test_a_service_that_exited_but_was_never_reaped_is_not_left_running(
    tmp_path: Path, spawned: list[subprocess.Popen[bytes]]
) -> None:
    """An orphan's parent may never reap it: a zombie group blocks no `exa up` and costs `exa down` no wait."""
    exited = subprocess.Popen([sys.executable, "-c", "pass"], start_new_session=True)
    spawned.append(exited)  # reaped only at the end of the test
    recorded = stamp(exited.pid)
    deadline = time.monotonic() + 30
    while stamp(exited.pid) is not None and not _zombie(exited.pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert _zombie(exited.pid) and group_alive(exited.pid)  # signals still reach it: the kernel keeps it
    run_dir = dead_supervisor(tmp_path, record("prefect", exited, recorded))
    assert not ours(exited.pid, recorded)
    claim(run_dir, tmp_path).close()
    dead_supervisor(tmp_path, record("prefect", exited, recorded))
    assert "was left running" not in down(tmp_path)  # nothing to stop, no stop grace to wait out


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] == "Z"
    except OSError:
        return False
