"""The printed side of ``closed_loop.py``: the timeline relative to the burst, the request totals, and the
must-hold bounds as PASS/FAIL lines.

``Timeline(t0)`` collects marks (``mark(at, text)``; ``None`` times are printed as not seen) and prints them
in time order. ``Totals.of(calls, traces)`` sums the requests (``closed_loop_traffic.Call``) with the version
each failed one was served by (from the trace store). ``Bounds`` collects named checks and says whether all
held.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from closed_loop_traffic import Call


@dataclass
class Timeline:
    t0: float
    start: str = "the burst start"
    marks: list[tuple[float | None, str]] = field(default_factory=list)

    def mark(self, at: float | None, text: str) -> None:
        self.marks.append((at, text))

    def print(self) -> None:
        print(f"timeline (seconds from {self.start}; 'not seen': it did not happen in the run)")
        for at, text in sorted(self.marks, key=lambda mark: float("inf") if mark[0] is None else mark[0]):
            when = "not seen" if at is None else f"{at - self.t0:+8.1f} s"
            print(f"  {when:>10}  {text}")

    def rel(self, at: float | None) -> str:
        return "-" if at is None else f"{at - self.t0:.1f} s"


@dataclass
class Totals:
    sent: int
    answered: int
    failed: Counter[str]
    lost: Counter[str]
    by_channel: dict[str, Counter[str]]
    versions: Counter[str]
    """Version -> answered calls it served."""
    failed_versions: Counter[tuple[str, str]]
    """(code, version from the trace store, or "unknown") -> failed calls."""

    @classmethod
    def of(cls, calls: list[Call], traces: Mapping[str, str | None]) -> Totals:
        failed, lost, versions, failed_versions = (
            Counter[str](),
            Counter[str](),
            Counter[str](),
            Counter[tuple[str, str]](),
        )
        by_channel: dict[str, Counter[str]] = {}
        for call in calls:
            by_channel.setdefault(call.channel, Counter())[call.outcome] += 1
            if call.outcome == "answered":
                versions[str(call.version)] += 1
            elif call.outcome == "failed":
                failed[str(call.code)] += 1
                version = traces.get(call.trace or "") or "unknown"
                failed_versions[(str(call.code), version)] += 1
            else:
                lost[call.detail.split(":")[0] or "no reply"] += 1
        answered = sum(versions.values())
        return cls(len(calls), answered, failed, lost, by_channel, versions, failed_versions)

    def not_from(self, failing: str | None) -> int:
        """Failed calls that are not a model failure (``inference_failed``) of version ``failing``."""
        return sum(n for (code, version), n in self.failed_versions.items()
                   if not (code == "inference_failed" and version == failing))  # fmt: skip

    def print(self) -> None:
        failed = sum(self.failed.values())
        print(f"requests sent {self.sent}: answered {self.answered}, failed {failed}, lost {sum(self.lost.values())}")
        for channel, outcomes in sorted(self.by_channel.items()):
            print(f"  {channel:>4}: " + ", ".join(f"{k} {v}" for k, v in sorted(outcomes.items())))
        print("  answered by version: " + ", ".join(f"v{k} {v}" for k, v in sorted(self.versions.items())))
        if failed:
            rows = sorted(self.failed_versions.items())
            print("  failed by code and serving version (trace store): "
                  + ", ".join(f"{code} v{version} {n}" for (code, version), n in rows))  # fmt: skip
        if self.lost:
            print("  lost: " + ", ".join(f"{k} {v}" for k, v in sorted(self.lost.items())))


@dataclass
class Bounds:
    checks: list[tuple[str, bool, str]] = field(default_factory=list)

    def check(self, name: str, held: bool, figure: str) -> None:
        self.checks.append((name, held, figure))

    @property
    def held(self) -> bool:
        return bool(self.checks) and all(held for _name, held, _figure in self.checks)

    def print(self) -> None:
        print("must hold")
        for name, held, figure in self.checks:
            print(f"  {'PASS' if held else 'FAIL'}  {name}: {figure}")


def gate_summary(decided: Mapping[str, Any]) -> str:
    """``loop.decided``'s gates in one line: gate passed/failed/not judged, with its figures."""
    parts = []
    for gate in decided.get("gates", []):
        verdict = {True: "pass", False: "FAIL", None: "not judged"}[gate.get("passed")]
        parts.append(f"{gate['gate']} {verdict} ({gate.get('detail', '')})")
    return "; ".join(parts)
