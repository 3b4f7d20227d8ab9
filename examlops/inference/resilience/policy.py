"""A resilience policy: one pydantic model, loadable from a mapping or YAML, bound to every route of the port.

Every section has a working default, so ``Policy()`` is a sensible policy and a YAML file names only what it
changes. An unknown key is refused (``extra="forbid"``): a misspelt setting fails at start-up, never silently.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator

from examlops.inference.errors import Kind


class _Section(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class RetryPolicy(_Section):
    """Retries of a whole ``predict_batch`` after a retryable failure (throttled, infrastructure)."""

    max_attempts: int = Field(default=3, ge=1)
    """Attempts in all, the first included (1: never retry)."""
    backoff_s: float = Field(default=0.05, gt=0)
    """The first backoff; each later one doubles, up to ``max_backoff_s``."""
    max_backoff_s: float = Field(default=2.0, gt=0)
    """The longest backoff of our own; a backend's ``Retry-After`` may ask for longer and is honoured
    up to ``max_retry_after_s``."""
    max_retry_after_s: float = Field(default=30.0, ge=0)
    """The longest ``Retry-After`` honoured: a backend asking for more is not retried (its error is raised)."""
    jitter_s: float = Field(default=0.05, ge=0)
    """A uniform random extra in [0, jitter_s] on every backoff, so callers throttled together spread out."""


class HedgePolicy(_Section):
    """A second attempt raced after the route's observed latency quantile, the first answer winning."""

    enabled: bool = True
    quantile: float = Field(default=0.95, gt=0, lt=1)
    """The latency quantile after which a hedge starts (the route's own p95 by default)."""
    window: int = Field(default=256, ge=8)
    """How many recent latencies the quantile is estimated over."""
    min_samples: int = Field(default=20, ge=1)
    """No hedging until this many latencies have been seen (the estimate means nothing before)."""
    min_delay_s: float = Field(default=0.001, ge=0)
    """The shortest hedge delay, whatever the estimate says."""
    budget_ratio: float = Field(default=0.1, ge=0, le=1)
    """At most this share of extra calls over the budget window (0.1: 10 % more calls at most)."""
    budget_window_s: float = Field(default=10.0, gt=0)


class BreakerPolicy(_Section):
    """A circuit breaker per route: open after too many failures, fail fast, probe, close on success."""

    enabled: bool = True
    failure_kinds: frozenset[Kind] = frozenset({Kind.THROTTLED, Kind.INFRASTRUCTURE})
    """Kinds that count as the backend failing (the retryable ones by default)."""
    failure_threshold: int = Field(default=5, ge=1)
    """Open after this many counted failures within ``window_s``..."""
    failure_ratio: float | None = Field(default=0.5, gt=0, le=1)
    """...or once this share of the calls within ``window_s`` failed (None: count only)..."""
    min_calls: int = Field(default=10, ge=1)
    """...over at least this many calls (a ratio of three calls says little)."""
    window_s: float = Field(default=10.0, gt=0)
    open_s: float = Field(default=5.0, gt=0)
    """How long an open breaker fails fast before it lets probes through (half-open)."""
    half_open_probes: int = Field(default=1, ge=1)
    """How many calls a half-open breaker lets through at once; the first success closes it."""


class SheddingPolicy(_Section):
    """Which calls fail fast while the backend is short, by the call's criticality."""

    enabled: bool = True
    throttle_window_s: float = Field(default=5.0, gt=0)
    """A throttled answer within this window puts the route under pressure."""
    default_after: int = Field(default=3, ge=1)
    """This many throttled answers within the window shed DEFAULT calls too (one sheds BEST_EFFORT)."""


class Policy(_Section):
    """Resilience for every route of the inference port; see ``examlops.inference.resilience``."""

    retry: RetryPolicy = Field(default_factory=RetryPolicy)
    hedge: HedgePolicy = Field(default_factory=HedgePolicy)
    breaker: BreakerPolicy = Field(default_factory=BreakerPolicy)
    shedding: SheddingPolicy = Field(default_factory=SheddingPolicy)

    @model_validator(mode="after")
    def _backoff_within_cap(self) -> Policy:
        if self.retry.backoff_s > self.retry.max_backoff_s:
            raise ValueError("retry.backoff_s is longer than retry.max_backoff_s")
        return self

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any] | None) -> Policy:
        """A policy from a mapping (an empty or missing one gives the defaults)."""
        return cls.model_validate(dict(data or {}))

    @classmethod
    def from_yaml(cls, source: str | Path) -> Policy:
        """A policy from YAML text or a YAML file's path."""
        text = source.read_text(encoding="utf-8") if isinstance(source, Path) else source
        loaded = yaml.safe_load(text)
        if loaded is not None and not isinstance(loaded, Mapping):
            raise ValueError("a resilience policy in YAML is a mapping of sections")
        return cls.from_mapping(loaded)
