"""What every benchmark needs to run the servers it measures: start, wait until ready, stop, quantiles."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import psutil


def start(argv: list[str], env: dict[str, str], log: Path, *, core: int | None = None) -> subprocess.Popen[bytes]:
    """``argv`` in its own session (so ``stop`` reaches its children), output to ``log``, pinned to ``core``."""
    pinned = ["taskset", "-c", str(core), *argv] if core is not None else argv
    return subprocess.Popen(pinned, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True)


def stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM the process group, SIGKILL it after 30 s."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def wait_until(
    check: Callable[[], bool], what: str, timeout: float = 120, proc: subprocess.Popen[bytes] | None = None
) -> float:
    """Seconds until ``check()`` held; exits the benchmark when ``proc`` dies or ``timeout`` passes."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if proc is not None and proc.poll() is not None:
            raise SystemExit(f"{what}: the process exited with {proc.returncode}")
        try:
            if check():
                return time.monotonic() - started
        except httpx.TransportError:
            pass
        time.sleep(0.25)
    raise SystemExit(f"{what} not ready after {timeout} s")


def answers(url: str) -> Callable[[], bool]:
    """A check that ``url`` answers 200."""
    return lambda: httpx.get(url, timeout=2).status_code == 200


def quantile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class CpuMeter:
    """CPU seconds of each named process and its children, read before and after a run."""

    def __init__(self, pids: dict[str, int]) -> None:
        self.procs = {name: psutil.Process(pid) for name, pid in pids.items()}

    def read(self) -> dict[str, float]:
        spent: dict[str, float] = {}
        for name, proc in self.procs.items():
            spent[name] = 0.0
            for one in [proc, *proc.children(recursive=True)]:
                try:
                    times = one.cpu_times()
                except psutil.Error:
                    continue
                spent[name] += times.user + times.system
        return spent


def split_cpu(pid: int) -> dict[str, float]:
    """CPU seconds so far of process ``pid`` itself (``own``), of its children (``children``), and of the
    calling process itself (``here``, the bench's client)."""
    spent = {"own": 0.0, "children": 0.0, "here": 0.0}
    try:
        proc = psutil.Process(pid)
        times = proc.cpu_times()
        spent["own"] = times.user + times.system
        for child in proc.children(recursive=True):
            try:
                times = child.cpu_times()
            except psutil.Error:
                continue
            spent["children"] += times.user + times.system
    except psutil.Error:
        pass
    times = psutil.Process().cpu_times()
    spent["here"] = times.user + times.system
    return spent


class StealMeter:
    """The share of the machine's CPU time the hypervisor gave to other guests (``steal`` in vmstat and
    ``psutil.cpu_times``) between ``start()`` and ``share()``. A segment with steal ran on a slower machine
    than its neighbours: on this host steal came and went in bursts of 15-30 % lasting minutes."""

    def __init__(self) -> None:
        self._at = self._now()

    @staticmethod
    def _now() -> tuple[float, float]:
        times = psutil.cpu_times()
        return getattr(times, "steal", 0.0), sum(times)

    def start(self) -> None:
        self._at = self._now()

    def share(self) -> float:
        (steal0, total0), (steal1, total1) = self._at, self._now()
        return (steal1 - steal0) / (total1 - total0) if total1 > total0 else 0.0


def thread_cpu(pid: int) -> dict[str, float]:
    """CPU seconds of a process's main thread (``main``) and of all its other threads (``threads``)."""
    spent = {"main": 0.0, "threads": 0.0}
    try:
        for thread in psutil.Process(pid).threads():
            spent["main" if thread.id == pid else "threads"] += thread.user_time + thread.system_time
    except psutil.Error:
        pass
    return spent


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def drain(url: str, timeout: float = 60.0, rest_s: float = 1.0) -> float:
    """Seconds until serving at ``url`` has no request in flight (its ``examlops_requests_in_flight``
    gauge at 0), then ``rest_s`` more: a backlog left by one segment of load must not run into the next."""
    began = time.monotonic()
    while time.monotonic() - began < timeout:
        try:
            text = httpx.get(f"{url}/metrics", timeout=5).text
        except httpx.HTTPError:
            break
        gauge = next((line for line in text.splitlines() if line.startswith("examlops_requests_in_flight ")), None)
        if gauge is None or float(gauge.split()[1]) == 0:
            break
        time.sleep(0.2)
    time.sleep(rest_s)
    return time.monotonic() - began
