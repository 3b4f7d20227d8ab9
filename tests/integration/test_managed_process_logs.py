"""A managed child's output goes to a log file rotated by size, with a bounded number of old files."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from examlops.core.errors import ServiceStartFailed
from examlops.core.settings import LogSettings
from examlops.platform.process import ManagedProcess

pytestmark = [pytest.mark.integration]

LINE = "x" * 99  # 100 bytes with its newline


def chatty(tmp_path: Path, lines: int, *, marker: str = "run") -> ManagedProcess:
    code = f"import sys\nfor i in range({lines}):\n    print('{marker}', f'{{i:06d}}', {LINE!r}, flush=True)\n"
    return ManagedProcess(
        "chatty",
        [sys.executable, "-c", code],
        log_path=tmp_path / "logs" / "chatty.log",
        health=lambda: True,
        logs=LogSettings(max_bytes=16_384, backups=3),
    )


def run_to_end(process: ManagedProcess) -> None:
    process.start()
    deadline = time.monotonic() + 30
    while process.alive():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert process.stop() == 0


def test_a_chatty_child_fills_at_most_the_rotated_files_and_the_newest_lines_are_kept(tmp_path: Path) -> None:
    run_to_end(chatty(tmp_path, 3000))  # about 330 KB of output
    logs = tmp_path / "logs"
    names = sorted(p.name for p in logs.iterdir())
    assert names == ["chatty.log", "chatty.log.1", "chatty.log.2", "chatty.log.3"]
    assert all((logs / name).stat().st_size <= 16_384 for name in names)
    newest = (logs / "chatty.log").read_text().splitlines()
    assert newest[-1].startswith("run 002999 ")
    # No line was torn or lost across a rotation: the files hold consecutive lines, oldest in .3.
    kept = [line for name in reversed(names) for line in (logs / name).read_text().splitlines()]
    numbers = [int(line.split()[1]) for line in kept]
    assert numbers == list(range(numbers[0], 3000))


def test_a_restart_rotates_the_previous_run_away(tmp_path: Path) -> None:
    run_to_end(chatty(tmp_path, 3, marker="first"))
    run_to_end(chatty(tmp_path, 3, marker="second"))
    logs = tmp_path / "logs"
    assert (logs / "chatty.log").read_text().startswith("second ")
    assert (logs / "chatty.log.1").read_text().startswith("first ")


def test_the_log_tail_of_a_child_that_failed_is_still_readable(tmp_path: Path) -> None:
    process = ManagedProcess(
        "failing",
        [sys.executable, "-c", "import sys; print('about to fail', flush=True); sys.exit(3)"],
        log_path=tmp_path / "failing.log",
        health=lambda: False,
    )
    process.start()
    with pytest.raises(ServiceStartFailed, match="exited with code 3") as failed:
        process.wait_ready(10)
    process.stop()
    assert "about to fail" in failed.value.log_tail
    assert "about to fail" in process.log_tail()


def test_stop_says_when_it_had_to_end_what_the_main_process_left_of_its_group(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # The shell exits on SIGTERM and leaves its `sleep` behind; the Python child has no children at all.
    leaves = ManagedProcess("leaves", ["sh", "-c", "sleep 60 & wait"], log_path=tmp_path / "a.log", health=lambda: True)
    tidy = ManagedProcess("tidy", [sys.executable, "-c", "import time; time.sleep(60)"],
                          log_path=tmp_path / "b.log", health=lambda: True)  # fmt: skip
    for process in (leaves, tidy):
        process.start()
    time.sleep(0.5)  # the shell has started its sleep
    with caplog.at_level("WARNING", logger="examlops.platform.process"):
        leaves.stop(grace=5)
        tidy.stop(grace=5)
    assert leaves.ended_leftovers and not tidy.ended_leftovers
    assert [r.getMessage().split(":")[0] for r in caplog.records] == ["leaves"]
