"""The control plane's sections of the settings object: the closed loop (``EXAMLOPS_LOOP__*``) and the `exa up`
supervisor (``EXAMLOPS_UP__*``). Same rules as ``setting_sections``: frozen, unknown keys refused, each
field's docstring is what `exa config show` prints.
"""

from __future__ import annotations

from pydantic import Field

from examlops.core.setting_sections import Section


class LoopSettings(Section):
    """The closed loop: the canary analysis after a retrain, its gates, and the guard after a promotion."""

    auto_canary: bool = True
    """Whether a retrain that points Canary at a better candidate starts the canary analysis itself."""
    canary_share: int = Field(10, ge=1, le=50)
    """Percent of the default alias's traffic sent to Canary during an analysis."""
    min_requests: int = Field(100, ge=1)
    """Calls Canary must answer or fail within the window before the analysis decides."""
    min_seconds: float = Field(60.0, ge=0)
    """Seconds the window lasts at least, however much traffic came."""
    max_seconds: float = Field(900.0, gt=0)
    """Seconds after which an analysis without enough traffic ends undecided and changes nothing."""
    poll_s: float = Field(5.0, gt=0)
    """Seconds between two looks at the figures."""
    failure_margin: float = Field(0.02, ge=0, le=1)
    """Canary passes when its model-failure rate exceeds Production's by at most this much."""
    max_failure_rate: float = Field(0.1, ge=0, le=1)
    """Canary never passes with a model-failure rate above this, however badly Production does."""
    p99_ratio: float = Field(1.2, ge=1)
    """Canary passes when its p99 latency is at most this many times Production's (plus ``p99_slack_ms``)."""
    p99_min_answers: int = Field(300, ge=1)
    """Canary answers below which the latency gate compares p95 (a p99 of fewer calls is mostly noise)."""
    p99_slack_ms: float = Field(10.0, ge=0)
    """Milliseconds added to the p99 bound, so that a millisecond of noise on a fast model decides nothing."""
    drift_p_value: float = Field(0.05, gt=0, lt=1)
    """Canary fails when its predictions differ from Production's in the same window (K-S p below this)."""
    drift_min_distance: float = Field(0.1, ge=0, le=1)
    """The K-S distance below which a difference in predictions is too small to count as drift."""
    drift_min_rows: int = Field(30, ge=2)
    """Bus predictions each version needs in the window before the drift gate is judged (else not judged)."""
    refusal_margin: float = Field(0.02, ge=0, le=1)
    """Canary passes when its share of late budget refusals exceeds Production's by at most this much."""
    rollback_min_calls: int = Field(20, ge=1)
    """Calls the promoted version must have answered or failed since its promotion before a failure trigger
    within the grace period can blame it and roll it back."""
    grace_s: float = Field(600.0, ge=0)
    """Seconds after the loop's promotion during which the failure trigger rolls the promotion back."""
    lease_s: float = Field(120.0, gt=0)
    """Seconds a loop holds its model without a sign of life before another run may take it over."""


class UpSettings(Section):
    """How `exa up` keeps its services running."""

    restart_limit: int = Field(5, ge=0)
    """Restarts of one service allowed within ``restart_window_s``; one more exit and it counts as failing:
    `exa up` then stops the platform (or, for the MLflow UI, which serving does not need, leaves it stopped)."""
    restart_window_s: float = Field(300.0, gt=0)
    """The window, in seconds, over which a service's exits are counted."""
    restart_backoff_s: float = Field(1.0, gt=0)
    """Seconds before the first restart of a service; doubled for each further exit within the window."""
    restart_backoff_cap_s: float = Field(30.0, gt=0)
    """The longest wait before a restart."""
