"""`exa predict --stream`: many instances from a JSONL file through a stream route, printed as they come.

``read_instances`` reads one instance a line (``{"embedding": [...], "node_count": n, "job_id": "..."}``,
or a bare JSON list as the embedding); a line that cannot be one is exit 2 naming its number.
``print_stream`` prints every chunk as it arrives (its NDJSON line with ``--json``, else one line a chunk)
with a progress bar on stderr, then exits 0 when every instance was answered, 1 when the budget ran out
mid-way (the last line says how many were answered) or the stream stopped on an error.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from examlops.cli.output import BAD_INPUT, UNWELL, console, err_console, fail


def read_instances(path: Path, node_count: int | None) -> list[dict[str, Any]]:
    """The instances of a JSONL file; ``node_count`` fills in lines that give none."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        fail(f"cannot read {path}: {exc.strerror}", BAD_INPUT)
    instances: list[dict[str, Any]] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            data = json.loads(line)
        except ValueError:
            fail(f"{path}:{number} is not JSON", BAD_INPUT)
        instance = {"embedding": data} if isinstance(data, list) else data
        if not isinstance(instance, dict) or "embedding" not in instance:
            fail(f"{path}:{number} must be an object with an embedding, or a JSON list of numbers", BAD_INPUT)
        if "node_count" not in instance:
            if node_count is None:
                fail(f"{path}:{number} has no node_count: add one, or give --node-count for every line", BAD_INPUT)
            instance["node_count"] = node_count
        instances.append(instance)
    if not instances:
        fail(f"{path} holds no instances", BAD_INPUT)
    return instances


def _chunk_text(chunk: dict[str, Any]) -> str:
    first, count = chunk["start"], len(chunk["predictions"])
    versions = ",".join(sorted(set(chunk["versions"])))
    left = chunk.get("budget_remaining_ms")
    budget = "" if left is None else f"  {left:.0f} ms left"
    predictions = " ".join(f"{p:.4f}" for p in chunk["predictions"])
    return f"{first}-{first + count - 1}  {chunk['model']} {chunk['alias']} v{versions}{budget}: {predictions}"


def print_stream(lines: Iterator[dict[str, Any]], total: int, *, as_json: bool) -> None:
    """Print the stream's lines as they arrive (module docstring); exits 1 when it ended early."""
    from rich.progress import Progress

    end: dict[str, Any] = {}
    with Progress(console=err_console, transient=True, disable=not err_console.is_terminal) as progress:
        bar = progress.add_task("streaming", total=total)
        for line in lines:
            if as_json:
                sys.stdout.write(json.dumps(line) + "\n")
                sys.stdout.flush()
            elif not line.get("done"):
                console.print(_chunk_text(line), highlight=False, soft_wrap=True)
            if line.get("done"):
                end = line
            else:
                progress.update(bar, advance=len(line["predictions"]))
    answered, asked = end.get("answered", 0), end.get("instances", total)
    if not as_json:
        console.print(f"answered {answered} of {asked}", highlight=False)
    if end.get("expired"):
        fail(f"the budget ran out after {answered} of {asked} instances; the rest were not run", UNWELL)
    if end.get("error"):
        error = end["error"]
        fail(str(error.get("error")), BAD_INPUT if error.get("code") == "invalid_input" else UNWELL)
    if not end:
        fail(f"the stream ended before its last line, after {progress.tasks[0].completed:.0f} instances", UNWELL)
