"""The reliability table of bench/RESULTS.md from the fault suite's figures (`make faults` writes them).

    .venv/bin/python bench/faults_table.py [.examlops/faults-report.jsonl]

One row per scenario line of the report, in its order: the load held, the faults injected, and the
checker's figures (jobs lost, duplicated, unrecorded; requests failed, of which answered with an error;
the time from each heal to the first good answer; the longest wait for a reply).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

HEADER = (
    "| scenario | load held | faults injected | lost | duplicated | unrecorded | recorded twice | "
    "requests failed (error replies) | audit chain | time to recover | longest wait |"
)


def row(line: dict[str, object]) -> str:
    recover = line.get("recover_s") or {}
    assert isinstance(recover, dict)
    recovered = ", ".join(f"{float(v):.2f} s" for v in recover.values()) or "n/a"
    failed = f"{line['requests_failed']} of {line['invoked']} ({line['answered_with_error']})"
    audit = f"verifies, {line['audit_events']} events" if line["audit_ok"] else "BROKEN"
    cells = [
        f"{line['scenario']}{' (long)' if line.get('long') else ''}",
        str(line["load"]),
        str(line["faults"]),
        str(line["lost"]),
        str(line["duplicated"]),
        str(line["unrecorded"]),
        str(line["recorded_twice"]),
        failed,
        audit,
        recovered,
        f"{line['max_latency_s']} s",
    ]
    return "| " + " | ".join(cells) + " |"


def main(path: Path) -> None:
    print(HEADER)
    print("|" + "---|" * HEADER.count(" | ") + "---|")
    for text in path.read_text().splitlines():
        if text.strip():
            print(row(json.loads(text)))


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else ".examlops/faults-report.jsonl"))
