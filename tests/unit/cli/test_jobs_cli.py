"""`exa jobs submit`: what it refuses before it asks serving anything (exit 2, naming the problem)."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from examlops.cli.main import app

runner = CliRunner()


@pytest.mark.parametrize(
    ("text", "budget", "said"),
    [
        ("", ["--budget", "1h"], "holds no instances"),
        ('{"embedding": [1.0], "node_count": 3}\n\nnot json\n', ["--budget", "1h"], "i.jsonl:3 is not JSON"),
        ('{"embedding": [1.0], "node_count": 3}\n', ["--budget", "30d"], "a job's budget is 1s to 7d: 30d is not"),
        ('{"embedding": [1.0], "node_count": 3}\n', ["--budget-ms", "5"], "a job's budget is 1s to 7d: 5 ms is not"),
        ('{"embedding": [1.0], "node_count": 3}\n', [], "give exactly one of --budget-ms N and --budget 2h"),
    ],
)
def test_a_file_or_budget_serving_would_refuse_is_exit_2_before_any_request(
    tmp_path: Path, text: str, budget: list[str], said: str
) -> None:
    path = tmp_path / "i.jsonl"
    path.write_text(text)
    env = {"EXAMLOPS_HOME": str(tmp_path / "state")}
    url = "http://127.0.0.1:9"  # nothing listens: a request would be exit 3, not 2
    result = runner.invoke(app, ["jobs", "submit", "--task", "t", "--file", str(path), *budget, "--url", url], env=env)
    assert result.exit_code == 2, result.output
    assert "".join(said.split()) in "".join(result.output.split())  # the console may wrap inside a path
