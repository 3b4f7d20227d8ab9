"""The reliability table of bench/RESULTS.md from the fault suite's figures (`make faults` writes them).

    .venv/bin/python bench/faults_table.py [.examlops/faults-report.jsonl] [--all]

The report holds the lines of every run appended to it; each line names its run (date, commit, command:
``tests/faults/conftest.py``). By default the table is of the last run only, under a line giving its date,
commit and command; ``--all`` prints one such table per run, oldest first (lines written before runs were
named form one run of their own). One row per scenario line, in its order: the load held, the faults
injected, and the checker's figures (jobs lost; answered jobs lost within 2 s before a Redis SIGKILL, the
bound the README states, a figure apart; duplicated, unrecorded, recorded twice, recorded though
never answered; requests failed, of which answered with an error; replies resent to retries; the time from
each heal to the first good answer; the longest wait). A figure the scenario could not measure (HTTP load
has no job ids, records or audit events to check) is n/a, never 0.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

HEADER = (
    "| scenario | load held | faults injected | lost | lost in AOF window | duplicated | unrecorded | recorded twice | "
    "recorded unanswered | requests failed (error replies) | resent | audit chain | time to recover | "
    "longest wait |"
)
UNNAMED = {"started": "unknown", "commit": "unknown", "command": "unknown"}


def cell(value: object) -> str:
    return "n/a" if value is None else str(value)


def row(line: dict[str, Any]) -> str:
    recover = line.get("recover_s") or {}
    assert isinstance(recover, dict)
    recovered = ", ".join(f"{float(v):.2f} s" for v in recover.values()) or "n/a"
    failed = f"{line['requests_failed']} of {line['invoked']} ({line['answered_with_error']})"
    if line.get("audit_ok") is None:
        audit = "n/a"
    else:
        audit = f"verifies, {line['audit_events']} events" if line["audit_ok"] else "BROKEN"
    cells = [
        f"{line['scenario']}{' (long)' if line.get('long') else ''}",
        str(line["load"]),
        str(line["faults"]),
        cell(line["lost"]),
        cell(line.get("lost_in_aof_window")),
        cell(line["duplicated"]),
        cell(line["unrecorded"]),
        cell(line["recorded_twice"]),
        cell(line.get("recorded_unanswered")),
        failed,
        cell(line.get("resent")),
        audit,
        recovered,
        f"{line['max_latency_s']} s",
    ]
    return "| " + " | ".join(cells) + " |"


def runs(text: str) -> list[tuple[dict[str, str], list[dict[str, Any]]]]:
    """The report's lines grouped by run, in the order the runs first appear."""
    grouped: dict[str, tuple[dict[str, str], list[dict[str, Any]]]] = {}
    for raw in text.splitlines():
        if raw.strip():
            line = json.loads(raw)
            run = line.get("run") or UNNAMED
            grouped.setdefault(json.dumps(run, sort_keys=True), (run, []))[1].append(line)
    return list(grouped.values())


def table(run: dict[str, str], lines: list[dict[str, Any]]) -> str:
    out = [
        f"Run of {run['started']}, at commit {run['commit']}, command `{run['command']}`; "
        "table by `bench/faults_table.py`:",
        "",
        HEADER,
        "|" + "---|" * (HEADER.count(" | ") + 1),
    ]
    out += [row(line) for line in lines]
    return "\n".join(out)


def main(path: Path, every_run: bool = False) -> None:
    found = runs(path.read_text())
    print("\n\n".join(table(run, lines) for run, lines in (found if every_run else found[-1:])))


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if a != "--all"]
    main(Path(args[0] if args else ".examlops/faults-report.jsonl"), every_run="--all" in sys.argv[1:])
