"""`exa predict --stream`: its arguments, the instances file, and what it prints and exits with."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from examlops.cli.main import app
from examlops.cli.stream import print_stream, read_instances

runner = CliRunner()


def chunk(n: int, start: int, size: int) -> dict[str, Any]:
    return {
        "chunk": n,
        "start": start,
        "predictions": [0.5] * size,
        "model": "JPCP",
        "alias": "Production",
        "versions": ["1"] * size,
        "budget_remaining_ms": 800.0,
    }


def end(answered: int, total: int, **extra: Any) -> dict[str, Any]:
    return {"done": True, "answered": answered, "instances": total, "expired": False, "error": None, **extra}


@pytest.mark.parametrize(
    "args",
    [
        ["predict", "JPCP", "--stream"],
        ["predict", "JPCP", "--file", "x.jsonl"],
        ["predict", "JPCP", "--stream", "--file", "x.jsonl", "--random"],
    ],
)
def test_stream_and_file_go_together_and_take_no_other_embedding(args: list[str]) -> None:
    result = runner.invoke(app, args)
    assert result.exit_code == 2


@pytest.mark.parametrize("instances", [["--random", "--node-count", "3"], ["--stream", "--file", "x.jsonl"]])
def test_an_alias_and_a_version_together_are_exit_2(instances: list[str]) -> None:
    result = runner.invoke(app, ["predict", "JPCP", *instances, "--alias", "canary", "--version", "2"])
    assert result.exit_code == 2 and "at most one of --alias A and --version N" in result.output


def test_a_single_call_still_needs_a_node_count() -> None:
    result = runner.invoke(app, ["predict", "JPCP", "--random"])
    assert result.exit_code == 2 and "--node-count" in result.output


def test_instances_are_read_one_a_line_and_the_node_count_fills_in(tmp_path: Path) -> None:
    path = tmp_path / "i.jsonl"
    path.write_text('{"embedding": [1.0], "node_count": 4, "job_id": "a"}\n\n[2.0, 3.0]\n')
    assert read_instances(path, 9) == [
        {"embedding": [1.0], "node_count": 4, "job_id": "a"},
        {"embedding": [2.0, 3.0], "node_count": 9},
    ]


@pytest.mark.parametrize("text", ['{"embedding": [1.0]}\n', "not json\n", '{"node_count": 3}\n', ""])
def test_a_line_that_cannot_be_an_instance_is_exit_2(tmp_path: Path, text: str) -> None:
    path = tmp_path / "i.jsonl"
    path.write_text(text)
    with pytest.raises(typer.Exit) as caught:
        read_instances(path, None)
    assert caught.value.exit_code == 2


def test_every_chunk_is_printed_as_it_comes_then_how_many_were_answered(capsys: pytest.CaptureFixture[str]) -> None:
    lines: Iterator[dict[str, Any]] = iter([chunk(0, 0, 2), chunk(1, 2, 1), end(3, 3)])
    print_stream(lines, 3, as_json=False)
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("0-1  JPCP Production v1  800 ms left: 0.5000 0.5000")
    assert out[1].startswith("2-2  ") and out[-1] == "answered 3 of 3"


def test_with_json_every_line_is_printed_as_it_came(capsys: pytest.CaptureFixture[str]) -> None:
    sent = [chunk(0, 0, 2), end(2, 2)]
    print_stream(iter(sent), 2, as_json=True)
    assert [json.loads(line) for line in capsys.readouterr().out.splitlines()] == sent


def test_a_stream_that_expired_mid_way_exits_1_saying_how_many_were_answered(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(typer.Exit) as caught:
        print_stream(iter([chunk(0, 0, 2), end(2, 10, expired=True)]), 10, as_json=False)
    assert caught.value.exit_code == 1
    assert "after 2 of 10" in capsys.readouterr().err
