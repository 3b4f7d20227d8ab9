"""A promotion against an MLflow server over HTTP that is stopped (its port refuses) or unreachable (a port that
accepts and never answers), from the start of the command, at its first write or at the alias write itself:
`exa promote` fails within its timeouts with a clear message, the alias stays where it was, and the trail
says what happened (nothing when the registry could not even be read; the intent and its failed outcome when
the write could not be made); `exa audit verify` accounts for every alias, and a rollback would still go to
the version the alias replaced before. An alias write that MLflow applied but whose answer was lost fails the
command the same way, and leaves what `exa audit verify` reports and a rollback that goes back to where the
alias was. A move made behind the trail's back is what `exa audit
verify` reports, however the per-alias index is tampered with.

Real processes: `mlflow server` on a SQLite store in the test's folder, reached through ``MlflowGate`` (a TCP
proxy that fails it on cue), a redis-server, `exa` as a child process (MLflow's HTTP limits are process-wide
environment variables, so not in the test's own process).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from examlops.core import keys
from examlops.platform.redis_server import EmbeddedRedis
from examlops.promotion.aliases import rollback_target
from tests.integration.mlflow_gate import MlflowGate, Mode
from tests.integration.servers import examlops_env, upgraded
from tests.ports import free_port

pytestmark = [
    pytest.mark.integration,
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::FutureWarning"),
]

MODEL = "AC"
"""A catalog model: `exa promote` looks the name up in the catalog before it asks MLflow."""
COMMAND_LIMIT_S = 60
"""Only so that a hang fails the test instead of stalling the suite; MLflow unbounded takes many minutes."""


def _seed(store: str) -> None:
    """A registered model with versions 1 and 2, Production at 1, written to the store before the server starts."""
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=store, registry_uri=store)
    client.create_registered_model(MODEL)
    for _ in range(2):
        client.create_model_version(MODEL, source="file:///nonexistent/model")
    client.set_registered_model_alias(MODEL, "Production", "1")


def _production(store: str) -> str:
    """The alias as the store itself holds it (SQLite, read without the server)."""
    from mlflow import MlflowClient

    version = (
        MlflowClient(tracking_uri=store, registry_uri=store).get_model_version_by_alias(MODEL, "Production").version
    )
    return str(version)


class MlflowServer:
    def __init__(self, home: Path, store: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = (home / "mlflow.log").open("wb")
        bin_dir = Path(sys.executable).parent
        self.proc = subprocess.Popen(
            [str(bin_dir / "mlflow"), "server", "--backend-store-uri", store, "--host", "127.0.0.1",
             "--port", str(self.port), "--workers", "1", "--default-artifact-root", str(home / "artifacts")],
            env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false", "MLFLOW_DISABLE_TELEMETRY": "true"},
            stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True, cwd=home,
        )  # fmt: skip
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, (home / "mlflow.log").read_text()[-2000:]
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.3)
        raise TimeoutError("mlflow server not ready")

    def signal(self, sig: signal.Signals) -> None:
        os.killpg(self.proc.pid, sig)

    def close(self) -> None:
        self.signal(signal.SIGCONT)
        self.signal(signal.SIGKILL)
        self.proc.wait()
        self.log.close()


@pytest.fixture(scope="module")
def outage(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[MlflowServer, dict[str, str], str]]:
    home = tmp_path_factory.mktemp("outage")
    store = f"sqlite:///{home / 'mlflow.db'}"
    _seed(store)
    redis = EmbeddedRedis(home / "redis", free_port())
    redis.start()
    server = MlflowServer(home, store)
    env = examlops_env(home, EXAMLOPS_REDIS__URL=redis.url, EXAMLOPS_MLFLOW__TRACKING_URI=server.url)
    env["EXAMLOPS_TOKEN"] = upgraded(env)
    env["COLUMNS"] = "400"  # rich wraps messages at 80 columns otherwise
    try:
        yield server, env, store
    finally:
        server.close()
        redis.stop()


def exa(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "examlops.cli.main", *args],
        env=env, capture_output=True, text=True, timeout=COMMAND_LIMIT_S,
    )  # fmt: skip


def _rollback_target(store: str) -> str | None:
    """Where `exa rollback` of Production would go, read from the store as the command reads it."""
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=store, registry_uri=store)
    current = str(client.get_model_version_by_alias(MODEL, "Production").version)
    return rollback_target(client.get_registered_model(MODEL).tags, "Production", current)


def alias_events(env: dict[str, str]) -> list[tuple[str, object, object]]:
    tail = exa(env, "audit", "tail", "-n", "100", "--json")
    assert tail.returncode == 0, tail.stderr
    return [(e["type"], e["data"]["from"], e["data"]["to"]) for e in json.loads(tail.stdout) if "alias" in e["type"]]


ALIAS_WRITE = "/registered-models/alias"
"""The path of MLflow's alias write (after the promotion's first write, its tag naming the move)."""
PROMOTE = ("promote", MODEL, "--alias", "Production", "--version", "2", "--timeout", "5")


@pytest.mark.parametrize("failure", ["down", "blackhole"])
@pytest.mark.parametrize("when", ["from_the_start", "at_the_first_write", "at_the_alias_write"])
def test_promotion_during_an_outage_fails_clearly_and_leaves_alias_and_trail_consistent(
    outage: tuple[MlflowServer, dict[str, str], str], when: str, failure: Mode
) -> None:
    server, env, store = outage
    if when == "from_the_start":
        gate = MlflowGate(server.port, failure)
    elif when == "at_the_first_write":
        gate = MlflowGate(server.port, fail_at_write=failure)
    else:
        gate = MlflowGate(server.port, fail_at_write=failure, write_path=ALIAS_WRITE)
    before, rollback_before = alias_events(env), _rollback_target(store)
    try:
        failed = exa({**env, "EXAMLOPS_MLFLOW__TRACKING_URI": gate.url}, *PROMOTE)
    finally:
        gate.close()
    assert failed.returncode == 3, failed.stdout + failed.stderr
    assert "the MLflow registry cannot be reached" in failed.stderr
    assert _production(store) == "1"  # the alias did not move
    assert _rollback_target(store) == rollback_before  # nor did where a rollback goes
    new = alias_events(env)[len(before) :]
    if when == "from_the_start":
        assert new == []  # the registry could not be read: nothing was intended, nothing moved
    else:
        assert gate.writes_held == 1  # the move was attempted, and never reached the registry
        assert new == [("alias.move_intended", "1", "2"), ("alias.move_failed", "1", "2")]
    verified = exa(env, "audit", "verify", "--json")
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert json.loads(verified.stdout)["aliases_unaccounted"] == []


def test_an_alias_write_applied_whose_answer_is_lost_is_reported_and_a_rollback_goes_back(
    outage: tuple[MlflowServer, dict[str, str], str],
) -> None:
    server, env, store = outage
    gate = MlflowGate(server.port, fail_at_write="lost", write_path=ALIAS_WRITE)
    before = alias_events(env)
    try:
        failed = exa({**env, "EXAMLOPS_MLFLOW__TRACKING_URI": gate.url}, *PROMOTE)
    finally:
        gate.close()
    assert failed.returncode == 3, failed.stdout + failed.stderr
    assert "the MLflow registry cannot be reached" in failed.stderr
    assert gate.writes_lost == 1
    assert _production(store) == "2"  # MLflow applied it
    assert _rollback_target(store) == "1"  # and a rollback goes back to where the alias was
    assert alias_events(env)[len(before) :] == [("alias.move_intended", "1", "2"), ("alias.move_failed", "1", "2")]
    verified = exa(env, "audit", "verify", "--json")
    assert verified.returncode == 1, verified.stdout + verified.stderr
    (line,) = json.loads(verified.stdout)["aliases_unaccounted"]
    assert "recorded as failed" in line and "did happen" in line
    # Put the alias back where the trail says it is, for the tests after this one.
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=store, registry_uri=store)
    client.set_registered_model_alias(MODEL, "Production", "1")
    assert exa(env, "audit", "verify").returncode == 0


def test_a_move_is_intent_then_outcome_and_a_move_behind_the_trail_is_reported_by_audit_verify(
    outage: tuple[MlflowServer, dict[str, str], str],
) -> None:
    _, env, store = outage
    # No serving instance answers, so the command ends with exit 1 after the move (that move stays done).
    moved = exa(env, "promote", MODEL, "--alias", "Production", "--version", "2", "--timeout", "2",
                "--url", f"http://127.0.0.1:{free_port()}")  # fmt: skip
    assert moved.returncode == 1, moved.stdout + moved.stderr
    assert "that move stays done" in moved.stderr
    assert _production(store) == "2"
    assert alias_events(env)[-2:] == [("alias.move_intended", "1", "2"), ("alias.moved", "1", "2")]
    assert exa(env, "audit", "verify").returncode == 0

    from mlflow import MlflowClient

    MlflowClient(tracking_uri=store, registry_uri=store).set_registered_model_alias(MODEL, "Production", "1")
    verify = exa(env, "audit", "verify", "--json")
    assert verify.returncode == 1
    (line,) = json.loads(verify.stdout)["aliases_unaccounted"]
    assert "last audited move put it at 2" in line and "registry has 1" in line
    _tampered_index_still_reports_the_move(env)

    again = exa(env, "promote", MODEL, "--alias", "Production", "--version", "2", "--timeout", "2",
                "--url", f"http://127.0.0.1:{free_port()}")  # fmt: skip
    assert "did not account for this alias" in again.stderr
    assert exa(env, "audit", "verify").returncode == 0  # the new move is what the trail last says


def _tampered_index_still_reports_the_move(env: dict[str, str]) -> None:
    """`exa audit verify` reads the last moves from the signed chain: the unsigned index, edited to agree with the
    registry or emptied, hides nothing."""
    import redis

    client = redis.Redis.from_url(env["EXAMLOPS_REDIS__URL"], decode_responses=True)
    field = f"{MODEL}/Production"
    original = client.hget(keys.AUDITED_ALIASES, field)
    assert isinstance(original, str)
    try:
        client.hset(keys.AUDITED_ALIASES, field, json.dumps({**json.loads(original), "new_version": "1", "to": "1"}))
        for tampered in ("edited", "deleted"):
            verify = exa(env, "audit", "verify", "--json")
            assert verify.returncode == 1, (tampered, verify.stdout)
            (line,) = json.loads(verify.stdout)["aliases_unaccounted"]
            assert "last audited move put it at 2" in line and "registry has 1" in line
            client.delete(keys.AUDITED_ALIASES)
    finally:
        client.hset(keys.AUDITED_ALIASES, field, original)  # what `exa promote`'s own check reads
        client.close()
