"""How an analysis is shown: a table of its gates and a small side-by-side plot of the two versions, as
text (the Prefect artifacts of the canary flow, and `exa canary start`)."""

from __future__ import annotations

from typing import Any

from examlops.loop.figures import VersionFigures
from examlops.loop.window import AnalysisResult

BAR = 30
"""Characters of the longest bar in the plot."""


def gate_rows(result: AnalysisResult) -> list[dict[str, Any]]:
    """One row per gate: its verdict, Canary's and Production's figure, the limit, what it compared."""
    verdicts = {True: "pass", False: "FAIL", None: "not judged"}
    return [
        {"gate": gate.gate, "verdict": verdicts[gate.passed], "canary": _round(gate.canary),
         "production": _round(gate.production), "limit": _round(gate.limit), "detail": gate.detail}
        for gate in result.gates
    ]  # fmt: skip


def side_by_side(result: AnalysisResult) -> str:
    """Markdown: the decision, then a bar per figure for Production and Canary."""
    production, canary = result.production, result.canary
    lines = [
        f"### {result.model}: {result.decision}",
        f"Canary v{canary.version} at {result.share} % against Production v{production.version}, "
        f"{result.decided_at - result.window_start:.0f} s window. {result.note}",
        "",
        "```",
    ]
    for label, pick, unit in (
        ("calls", lambda f: float(f.requests), ""),
        ("model-failure rate", lambda f: f.failure_rate, ""),
        ("p50 latency", lambda f: f.p50_ms, " ms"),
        ("p99 latency", lambda f: f.p99_ms, " ms"),
    ):
        values = pick(production), pick(canary)
        top = max((v for v in values if v is not None), default=0.0) or 1.0
        lines.append(label)
        for name, value in zip((f"Production v{production.version}", f"Canary v{canary.version}"), values, strict=True):
            lines.append(f"  {name:<18} {_bar(value, top)} {_shown(value)}{unit if value is not None else ''}")
    lines.append("```")
    return "\n".join(lines)


def _bar(value: float | None, top: float) -> str:
    if value is None:
        return " " * BAR
    return ("█" * round(BAR * value / top)).ljust(BAR)


def _shown(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.0f}" if value >= 100 else f"{value:.3g}"


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


def figures_line(figures: VersionFigures) -> str:
    p99 = "-" if figures.p99_ms is None else f"{figures.p99_ms:.1f} ms"
    return f"v{figures.version}: {figures.requests} calls, failure rate {figures.failure_rate:.3f}, p99 {p99}"
