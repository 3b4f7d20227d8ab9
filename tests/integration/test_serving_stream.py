"""Streams against the real serving process: 200 instances come back in order, chunk by chunk, with the
same predictions single calls get; `exa predict --stream` prints them as they arrive."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from typer.testing import CliRunner

from examlops.cli.main import app as exa
from examlops.core.settings import Settings
from examlops.registry.catalog import load_catalog
from examlops.registry.demo import seed_demo
from tests.integration.servers import ServingProcess

pytestmark = [
    pytest.mark.integration,
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::UserWarning"),
    pytest.mark.filterwarnings("ignore::FutureWarning"),
]

INSTANCES, BATCH = 200, 16


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, redis_server: str) -> Iterator[ServingProcess]:
    home = tmp_path_factory.mktemp("stream")
    settings = Settings(home=home)
    seed_demo(settings, load_catalog(settings.catalog_path))
    env = {
        "EXAMLOPS_REDIS__URL": redis_server,
        "EXAMLOPS_BATCH__MAX_SIZE": str(BATCH),
        "EXAMLOPS_PREDICT__WORKERS": "2",
    }
    proc = ServingProcess(home, env=env)
    try:
        proc.wait_ready()
        yield proc
    finally:
        assert proc.stop() == 0, proc.log_tail()


def instances(n: int) -> list[dict[str, Any]]:
    rng = np.random.default_rng(7)
    # Three decimals keep 200 instances well under the 1 MiB body limit.
    return [
        {"embedding": [round(float(v), 3) for v in rng.normal(0, 0.05, 384)], "node_count": 3 + i % 40}
        for i in range(n)
    ]


def test_a_stream_of_200_instances_answers_every_one_in_order_as_single_calls_would(server: ServingProcess) -> None:
    rows = instances(INSTANCES)
    lines: list[dict[str, Any]] = []
    with httpx.stream(
        "POST",
        f"{server.url}/v1/tasks/pavement.distress.jpcp/stream",
        json={"instances": rows, "budget_ms": 60_000},
        headers=server.auth,
        timeout=60,
    ) as reply:
        assert reply.status_code == 200, reply.read()
        assert reply.headers["content-type"] == "application/x-ndjson"
        assert reply.headers["x-examlops-trace"]
        lines = [json.loads(line) for line in reply.iter_lines() if line]
    *chunks, end = lines
    assert [c["chunk"] for c in chunks] == list(range(len(chunks)))
    assert [c["start"] for c in chunks] == list(range(0, INSTANCES, BATCH))
    assert {(c["model"], c["alias"]) for c in chunks} == {("JPCP", "Production")}
    assert all(0 < c["budget_remaining_ms"] <= 60_000 for c in chunks)
    predictions = [p for c in chunks for p in c["predictions"]]
    assert end == {**end, "done": True, "answered": INSTANCES, "instances": INSTANCES, "expired": False, "error": None}
    for i in (0, 57, INSTANCES - 1):
        single = httpx.post(
            f"{server.url}/v1/tasks/pavement.distress.jpcp/infer", json=rows[i], headers=server.auth, timeout=30
        )
        assert single.json()["prediction"] == pytest.approx(predictions[i])


def test_a_bad_instance_in_the_first_batch_is_a_422_naming_it(server: ServingProcess) -> None:
    rows = instances(40)
    rows[5]["embedding"] = [0.1, 0.2]
    reply = httpx.post(f"{server.url}/v1/models/JPCP/stream", json={"instances": rows}, headers=server.auth, timeout=30)
    assert reply.status_code == 422
    assert reply.json()["field"] == "instances.5.embedding"


def test_exa_predict_stream_prints_every_chunk_as_ndjson(server: ServingProcess, tmp_path: Path) -> None:
    path = tmp_path / "instances.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in instances(50)))
    runner = CliRunner(env={"EXAMLOPS_TOKEN": server.token})
    result = runner.invoke(
        exa,
        [
            *("predict", "--task", "pavement.distress.jpcp", "--file", str(path), "--stream"),
            *("--budget-ms", "60000", "--url", server.url, "--json"),
        ],
    )
    assert result.exit_code == 0, result.output
    *chunks, end = [json.loads(line) for line in result.stdout.splitlines()]
    assert [c["start"] for c in chunks] == [0, 16, 32, 48]
    assert (end["answered"], end["expired"]) == (50, False)
    table = runner.invoke(exa, ["predict", "JPCP", "--file", str(path), "--stream", "--url", server.url])
    assert table.exit_code == 0, table.output
    assert "0-15  JPCP Production" in table.stdout and "answered 50 of 50" in table.stdout


def test_a_stream_over_the_body_limit_is_exit_2_naming_the_instances_and_offline_jobs(
    server: ServingProcess, tmp_path: Path
) -> None:
    path = tmp_path / "big.jsonl"
    rng = np.random.default_rng(3)  # full-precision floats: 200 instances of 384 make about 1.5 MB
    path.write_text("".join(json.dumps({"embedding": rng.normal(0, 0.05, 384).tolist()}) + "\n" for _ in range(200)))
    assert path.stat().st_size > 1 << 20
    runner = CliRunner(env={"EXAMLOPS_TOKEN": server.token})
    args = ["predict", "JPCP", "--file", str(path), "--node-count", "12", "--stream", "--url", server.url]
    result = runner.invoke(exa, args)
    assert result.exit_code == 2, result.output
    said = " ".join(result.output.split())  # the console wraps long lines
    assert "larger than 1048576 bytes (200 instances in one stream)" in said
    assert f"exajobssubmit--taskT--file{path}" in "".join(said.split())  # the console may wrap inside the path


LATE = "the budget ran out before the call reached serving's queue"


@pytest.mark.parametrize(
    ("budget_ms", "said"),
    [("0.01", (LATE,)), ("1", ("estimated", LATE))],  # 1 ms: refused by the estimate, or spent before it
)
def test_exa_predict_with_a_budget_serving_cannot_meet_prints_serving_s_refusal(
    server: ServingProcess, budget_ms: str, said: tuple[str, ...]
) -> None:
    """The budget is serving's: the CLI waits beyond it for the answer, so the refusal (exit 3, with its trace)
    is what the user sees, not a timeout of the CLI's own before the call reached serving."""
    runner = CliRunner(env={"EXAMLOPS_TOKEN": server.token})
    args = ["predict", "--task", "pavement.distress.jpcp", "--random", "--node-count", "12", "--url", server.url]
    result = runner.invoke(exa, [*args, "--budget-ms", budget_ms])
    output = " ".join(result.output.split())
    assert result.exit_code == 3, output
    assert any(reason in output for reason in said) and "[trace " in output
