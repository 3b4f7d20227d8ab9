"""`exa bridge status`: per model, the failure rate, how full the window is, the cooldown left, the last retrain.

Thin: reads the shared windows, cooldowns and retrain records in Redis through
``examlops.monitoring.failure_store``; works from any process, whichever bridges run.
The lead registers ``status`` on the ``bridge`` group.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from examlops.cli.output import JsonOption, errors_as_exit, load_settings, print_json, print_table


def status(as_json: JsonOption = False) -> None:
    """Per model: failure rate over the shared window, its fill, the retrain cooldown left and the last request."""
    from examlops.bootstrap import catalog
    from examlops.bootstrap.control import failure_store
    from examlops.monitoring.failures import failure_status

    settings = load_settings()
    with errors_as_exit():
        models = [spec.name for spec in catalog(settings)]
        with failure_store(settings) as store:
            rows = failure_status(store, models, settings.failure.window)
    if as_json:
        print_json(
            {
                "window": settings.failure.window,
                "threshold": settings.failure.threshold,
                "cooldown_s": settings.failure.cooldown_s,
                "models": [row.to_json() for row in rows],
            }
        )
        return
    print_table(
        f"retrain trigger (rate >= {settings.failure.threshold} over {settings.failure.window} requests, "
        f"cooldown {settings.failure.cooldown_s:.0f} s)",
        ["model", "failure rate", "window", "cooldown left", "last retrain request"],
        [
            [
                row.model,
                f"{row.window.rate:.2f} ({row.window.failures} failed)",
                f"{row.window.size}/{row.window.capacity}",
                f"{row.cooldown_left_s:.0f} s" if row.cooldown_left_s else "-",
                _last(row.last_request),
            ]
            for row in rows
        ],
    )


def _last(record: dict[str, Any] | None) -> str:
    if not record:
        return "-"
    when = datetime.fromtimestamp(float(record["requested_at"]), UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    if record.get("delivered_at"):
        return f"{when}, flow run {record.get('flow_run_id')}"
    error = f": {record['error']}" if record.get("error") else ""
    return f"{when}, not delivered yet ({record.get('attempts', 0)} attempts{error})"
