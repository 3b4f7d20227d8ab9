"""`exa up --detach`, `exa status --json`, `exa down` as a user runs them, against the real services.

The first test runs the whole platform as `make up` does (demo models seeded, every service), sends a
job over the bus and a request over HTTP, and checks that `exa down` leaves nothing behind. The others
run Redis alone to test the supervisor's lifecycle quickly.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis

from examlops.platform.leftovers import running, stamp
from examlops.platform.process import pid_alive
from tests.ports import free_port

pytestmark = pytest.mark.e2e

EXPECTED = ("redis", "mlflow", "prefect", "serving", "bridge", "flows")


def _processes_mentioning(text: str) -> list[str]:
    """Every process whose command line (or, on Linux, environment) mentions ``text``."""
    ps = subprocess.run(["ps", "-eo", "pid=,args="], capture_output=True, text=True, check=True).stdout
    found = [line.strip() for line in ps.splitlines() if text in line and "pytest" not in line]
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            if text.encode() in environ.read_bytes() and int(environ.parent.name) != os.getpid():
                found.append(f"{environ.parent.name} (environment)")
        except OSError:
            continue
    return found


class Exa:
    def __init__(self, env: dict[str, str]) -> None:
        self.env = env

    def __call__(self, *args: str, timeout: float = 150) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "examlops.cli.main", *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )


def platform_env(home: Path, **extra: str) -> dict[str, str]:
    """The environment of an `exa up` in ``home`` on free ports, with no EXAMLOPS_* of the caller's, plus
    ``extra``. The services start in the state folder: PYTHONPATH keeps them on the code under test, not on
    whatever checkout the environment's editable install points at."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("EXAMLOPS_")}
    env.update(
        EXAMLOPS_HOME=str(home),
        EXAMLOPS_REDIS__PORT=str(free_port()),
        EXAMLOPS_MLFLOW__UI_PORT=str(free_port()),
        EXAMLOPS_PREFECT__PORT=str(free_port()),
        EXAMLOPS_SERVING__PORT=str(free_port()),
        COLUMNS="200",
        PYTHONPATH=os.pathsep.join(
            filter(None, [str(Path(__file__).resolve().parents[2]), os.environ.get("PYTHONPATH")])
        ),
        **extra,
    )
    return env


@pytest.fixture
def exa(tmp_path: Path) -> Iterator[Exa]:
    env = platform_env(tmp_path / "state")
    runner = Exa(env)
    yield runner
    runner("down", timeout=90)  # whatever the test did, leave nothing running


def test_the_whole_platform_comes_up_answers_and_leaves_no_process_behind(exa: Exa, tmp_path: Path) -> None:
    up = exa("up", "--detach", "--timeout", "240", timeout=300)
    assert up.returncode == 0, up.stdout + up.stderr
    for title in ("Redis", "MLflow UI", "Prefect UI", "Serving API", "OpenAPI docs", "Bus bridge"):
        assert title in up.stdout
    for name in ("admin.token", "bridge.token"):  # the bridge presents its own identity to serving
        assert (Path(exa.env["EXAMLOPS_HOME"]) / name).stat().st_mode & 0o777 == 0o600

    by_http = exa("serve", "infer-check", "--json")
    assert by_http.returncode == 0, by_http.stdout + by_http.stderr
    assert json.loads(by_http.stdout)["version"] == "1"
    by_bus = exa("bus", "send", "JPCP", "--random", "--node-count", "7", "--alias", "canary", "--json")
    assert by_bus.returncode == 0, by_bus.stdout + by_bus.stderr
    assert json.loads(by_bus.stdout)["version"] == "2"
    trace_id = json.loads(by_bus.stdout)["trace"]
    deadline = time.monotonic() + 30  # serving writes traces in batches, off the request path
    while (shown := exa("trace", "show", trace_id, "--json")).returncode != 0 and time.monotonic() < deadline:
        time.sleep(0.5)
    assert shown.returncode == 0, shown.stdout + shown.stderr
    trace = json.loads(shown.stdout)
    assert (trace["channel"], trace["identity"], trace["outcome"]) == ("bus", "admin", "answered")  # relayed
    audit = exa("audit", "verify", "--json")
    assert audit.returncode == 0, audit.stdout + audit.stderr

    status = exa("status", "--json")
    assert status.returncode == 0, status.stdout + status.stderr
    doc = json.loads(status.stdout)
    services = {s["name"]: s for s in doc["services"]}
    assert sorted(services) == sorted(EXPECTED)
    serving = services["serving"]["url"]
    assert httpx.get(serving + "/v1/models", timeout=5).status_code == 401
    admin_token = (Path(exa.env["EXAMLOPS_HOME"]) / "admin.token").read_text().strip()
    admin = {"Authorization": f"Bearer {admin_token}"}
    assert httpx.get(serving + "/v1/models", headers=admin, timeout=5).status_code == 200
    assert all(services[name]["state"] == "running" for name in EXPECTED), doc
    client = redis.Redis.from_url(services["redis"]["url"])
    try:
        assert client.ping()
    finally:
        client.close()
    assert httpx.get(services["mlflow"]["url"] + "/health", timeout=5).status_code == 200
    assert httpx.get(services["prefect"]["url"] + "/api/health", timeout=5).status_code == 200
    recorded = [doc["supervisor_pid"]] + [s["pid"] for s in services.values()]

    down = exa("down", timeout=90)
    assert down.returncode == 0, down.stdout + down.stderr

    assert [pid for pid in recorded if pid_alive(pid)] == []
    assert _processes_mentioning(str(tmp_path / "state")) == []
    after = exa("status", "--json")
    assert after.returncode == 1
    assert json.loads(after.stdout)["services"] == []
    assert "nothing running" in exa("down").stdout


REDIS_ONLY = (
    "--no-seed",
    *("--skip", "mlflow", "--skip", "prefect", "--skip", "serving", "--skip", "bridge", "--skip", "flows"),
)


def _start_foreground(exa: Exa) -> tuple[subprocess.Popen[str], dict[str, object]]:
    """`exa up` with redis only, in the foreground; returns once up.json says ready."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "examlops.cli.main", "up", *REDIS_ONLY],
        env=exa.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    up_json = Path(exa.env["EXAMLOPS_HOME"]) / "run" / "up.json"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            doc: dict[str, object] = json.loads(up_json.read_text())
            if doc["state"] == "ready":
                return proc, doc
        except (OSError, ValueError):
            pass
        time.sleep(0.1)
    proc.kill()
    raise AssertionError(f"exa up never became ready:\n{proc.communicate()[0]}")


def _redis_pid(doc: dict[str, object]) -> int:
    services = doc["services"]
    assert isinstance(services, list)
    pid = services[0]["pid"]
    assert isinstance(pid, int)
    return pid


def test_foreground_up_stops_every_process_on_sigint(exa: Exa) -> None:
    proc, doc = _start_foreground(exa)
    proc.send_signal(signal.SIGINT)
    output, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, output
    assert "stopped redis" in output
    assert not pid_alive(_redis_pid(doc))
    assert not (Path(exa.env["EXAMLOPS_HOME"]) / "run" / "up.json").exists()


def test_second_up_is_refused_while_one_runs(exa: Exa) -> None:
    proc, _ = _start_foreground(exa)
    try:
        second = exa("up", *REDIS_ONLY, timeout=30)
        assert second.returncode == 1
        assert "already running" in second.stderr
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)


def test_a_killed_supervisor_leaves_its_services_to_exa_down_and_no_second_up_starts_beside_them(exa: Exa) -> None:
    proc, doc = _start_foreground(exa)
    redis_pid = _redis_pid(doc)
    services = doc["services"]
    assert isinstance(services, list) and services[0]["stamp"] == stamp(redis_pid)  # whose group it is
    proc.kill()
    proc.communicate(timeout=30)
    try:
        assert running(redis_pid)  # the supervisor died; its service did not
        again = exa("up", *REDIS_ONLY, timeout=30)
        assert again.returncode == 1 and "ended without stopping redis" in again.stderr, again.stderr
        status = json.loads(exa("status", "--json").stdout)
        assert status["services"][0]["state"] == "running", status
    finally:
        down = exa("down", timeout=90)
    assert down.returncode == 0 and "redis (group" in down.stderr, down.stderr
    assert not running(redis_pid)
    assert not (Path(exa.env["EXAMLOPS_HOME"]) / "run" / "up.json").exists()


def _wait_running_again(exa: Exa, old_pid: int) -> dict[str, object]:
    """The status document once redis runs under a pid other than ``old_pid``."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        status = exa("status", "--json")
        doc: dict[str, object] = json.loads(status.stdout)
        services = doc["services"]
        assert isinstance(services, list)
        if services and services[0]["state"] == "running" and services[0]["pid"] != old_pid:
            return doc
        time.sleep(0.2)
    raise AssertionError(f"redis did not come back: {doc}")


def test_a_killed_service_is_restarted_and_one_that_keeps_failing_stops_the_rest(exa: Exa) -> None:
    exa.env.update(EXAMLOPS_UP__RESTART_LIMIT="1", EXAMLOPS_UP__RESTART_BACKOFF_S="0.2")
    proc, doc = _start_foreground(exa)
    first = _redis_pid(doc)
    os.kill(first, signal.SIGKILL)
    again = _wait_running_again(exa, first)
    (redis_service,) = again["services"]  # type: ignore[misc]
    assert (redis_service["restarts"], redis_service["last_exit"]) == (1, -9)
    os.kill(redis_service["pid"], signal.SIGKILL)  # the second exit within the window: it keeps failing
    output, _ = proc.communicate(timeout=30)
    assert proc.returncode == 3, output
    assert "redis exited unexpectedly with code -9: restarting in 0.2 s" in output
    assert "redis is back" in output
    assert "keeps failing" in output


def test_a_taken_port_is_refused_naming_the_setting(exa: Exa) -> None:
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", int(exa.env["EXAMLOPS_REDIS__PORT"])))
        squatter.listen()
        result = exa("up", *REDIS_ONLY, timeout=30)
    assert result.returncode == 2
    assert "EXAMLOPS_REDIS__PORT" in result.stderr


def test_up_detach_json_prints_the_services_for_scripts(exa: Exa) -> None:
    up = exa("up", "--detach", "--json", *REDIS_ONLY, "--timeout", "60")
    assert up.returncode == 0, up.stdout + up.stderr
    doc = json.loads(up.stdout)
    (redis_service,) = doc["services"]
    assert redis_service["name"] == "redis" and redis_service["state"] == "running"
    assert redis_service["url"].startswith("redis://127.0.0.1:")
    assert exa("down").returncode == 0
    refused = exa("up", "--json", *REDIS_ONLY)
    assert refused.returncode == 2
    assert "--detach" in refused.stderr
