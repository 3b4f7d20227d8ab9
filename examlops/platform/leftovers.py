"""Whether a process group named in a dead supervisor's ``up.json`` is still the one it started.

``exa up`` records, per service, its process group and a stamp of the group's leader (``stamp``: this
boot's id and the leader's start time, from ``/proc``). A SIGKILLed supervisor leaves that record behind;
``ours(pgid, stamp)`` tells the next ``exa up`` and ``exa down`` whether the group still runs *and* is that
service's, so that after a reboot, or once the ids were handed out again, neither refuses to start nor
signals a stranger's processes.

Contract of ``ours``: False when no process of group ``pgid`` runs (zombies, exited but not reaped, do
not count: an orphan's parent may never reap it); False when the stamp names another boot, or when the
group's leader is a different process than the stamped one; True when the leader is the stamped process,
or when the leader has exited but its group lives on within the same boot (Linux hands out no pid still in
use as a group id, so such a group is the remnant of ours, unless ours ended whole and a stranger's process
given that pid led a group of its own and exited: not told apart). Without a stamp (a record written
before stamps) a running group is taken as ours, as before. ``running``/``group_running``: the same
liveness for one process and one group; where ``/proc`` cannot be read, a zombie counts as alive.
"""

from __future__ import annotations

from pathlib import Path

from examlops.platform.process import group_alive, pid_alive

PROC = Path("/proc")


def _boot_id() -> str | None:
    try:
        return (PROC / "sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return None


def _start_ticks(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (field 22 of ``/proc/<pid>/stat``)."""
    try:
        stat = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    fields = _state(stat)
    return fields[19] if len(fields) > 19 else None


def _state(stat: str) -> list[str]:
    """The fields of a ``/proc/<pid>/stat`` after the command name: state, ppid, pgrp, ..."""
    return stat.rpartition(")")[2].split()  # the command name may hold spaces and parentheses


def running(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie."""
    try:
        fields = _state((PROC / str(pid) / "stat").read_text())
    except OSError:
        return pid_alive(pid) if not PROC.is_dir() else False
    return bool(fields) and fields[0] != "Z"


def group_running(pgid: int) -> bool:
    """Whether a process of group ``pgid`` exists and is not a zombie."""
    if not group_alive(pgid):
        return False
    if not PROC.is_dir():
        return True
    for stat in PROC.glob("[0-9]*/stat"):
        try:
            fields = _state(stat.read_text())
        except OSError:
            continue  # gone meanwhile
        if len(fields) > 2 and fields[2] == str(pgid) and fields[0] != "Z":
            return True
    return False


def stamp(pid: int | None) -> str | None:
    """``<boot id>:<start ticks>`` of process ``pid``; None where ``/proc`` does not say."""
    if pid is None:
        return None
    boot, ticks = _boot_id(), _start_ticks(pid)
    return f"{boot}:{ticks}" if boot and ticks else None


def ours(pgid: int, recorded: str | None) -> bool:
    """Whether group ``pgid`` is alive and is the one stamped ``recorded``; see the module docstring."""
    if not group_running(pgid):
        return False
    if recorded is None:
        return True
    boot, _, ticks = recorded.partition(":")
    if boot != _boot_id():
        return False
    leader = _start_ticks(pgid)
    return leader is None or leader == ticks
