"""What the dashboard reads and acts through: small ports, each met by a service the CLI uses too.

The serving process passes what it owns (the pipeline, its metrics registry, the trace store, the job
service) to ``dashboard_router``; the composition root (``examlops.bootstrap.dashboard``) builds the rest
(``DashboardSources``: the audit trail, drift rows, loop records, failure windows, the promotion service,
Prefect's flow runs) and attaches them to the app (``attach_sources``). A source left None is shown as "not
available here", never as an error. Every source call may block (SQL, Redis, MLflow, Prefect): the routes call
them off the event loop. Failure mode: a source raises an ``ExamlopsError`` (``StoreUnavailable`` mostly); the
page shows it in place.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from examlops.identity import Caller
from examlops.registry.catalog import Catalog


class Pipeline(Protocol):
    """What the pages need of serving's pipeline (``examlops.serving.pipeline.Pipeline``)."""

    catalog: Catalog

    def hot_set(self) -> Sequence[Any]: ...

    def traffic(self, model: str) -> dict[str, int]: ...

    def check_traffic(self, model: str, weights: Mapping[str, int]) -> dict[str, int]: ...

    def set_traffic(self, model: str, weights: Mapping[str, int], actor: str = ...) -> dict[str, int]: ...

    async def reload(self, model: str | None = None, *, actor: str = ...) -> Sequence[Any]: ...


@dataclass(frozen=True, slots=True)
class AuditEntry:
    seq: int
    time: str
    type: str
    subject: str
    actor: str
    data: str


@dataclass(frozen=True, slots=True)
class AuditCheck:
    """The last stored result of `exa audit verify` (or the retention flow's verify): ``broken`` is None when
    the chain and the aliases were intact, else what was wrong; ``at`` when it ran (UNIX time), ``by`` who ran
    it, ``last_seq`` the newest event it covered, ``notes`` what it could not check. Older than
    ``stale_after_s`` (``audit.verify_stale_s``) it is not current; ``readable`` False: the stored value could
    not be read (``broken`` says so)."""

    events: int
    checkpoints: int
    broken: str | None
    at: float = 0.0
    by: str = ""
    last_seq: int = 0
    notes: tuple[str, ...] = ()
    stale_after_s: float = 900.0
    readable: bool = True


class AuditView(Protocol):
    def tail(self, n: int) -> list[AuditEntry]: ...

    def last_check(self) -> AuditCheck | None:
        """The last stored verify result (one small read, never a walk of the chain); None: none stored yet."""


@dataclass(frozen=True, slots=True)
class DriftPoint:
    """One drift status row: a report's test on one kind (prediction or input) of one model."""

    model: str
    kind: str
    version: str
    at: float
    score: float
    threshold: float
    drifted: bool
    report_html: str


class DriftHistory(Protocol):
    def history(self, model: str, limit: int) -> list[DriftPoint]:
        """The newest ``limit`` rows of ``model`` (every kind), oldest first."""


@dataclass(frozen=True, slots=True)
class FailureWindow:
    model: str
    rate: float
    size: int
    capacity: int
    cooldown_left_s: float


class FailureWindows(Protocol):
    def windows(self, models: Sequence[str]) -> dict[str, FailureWindow]: ...


class LoopRecords(Protocol):
    def records(self) -> dict[str, dict[str, Any]]:
        """Per model, its loop record as `exa loop status --json` shows it."""


@dataclass(frozen=True, slots=True)
class Moved:
    model: str
    old_version: str | None
    new_version: str
    instances: tuple[str, ...]
    warnings: tuple[str, ...] = ()
    """What the promotion service reported without stopping: what the trail could not account for in the
    alias before the move (``unaccounted``), an audit write that failed (``warnings``)."""
    nothing_to_do: bool = False
    """Production already pointed at the version: nothing was written and no instance was asked."""


class Promoter(Protocol):
    """``examlops.promotion.service`` with the audit hook naming ``actor``: what `exa promote --from Canary`
    and `exa rollback` run (every serving instance reloads and confirms)."""

    def promote_canary(self, model: str, actor: str) -> Moved: ...

    def rollback(self, model: str, actor: str) -> Moved: ...


@dataclass(frozen=True, slots=True)
class FlowRun:
    """One Prefect flow run that names a model in its parameters; ``url`` is its page in the Prefect UI."""

    id: str
    name: str
    flow: str
    state: str
    started_at: float | None
    url: str


class FlowRuns(Protocol):
    def runs(self, model: str, limit: int) -> list[FlowRun]:
        """The newest ``limit`` flow runs whose parameters name ``model``, newest first."""


class Authenticator(Protocol):
    """``examlops.identity.IdentityResolver``: a token to a ``Caller``, ``Unauthenticated`` else."""

    def authenticate(self, token: str | None) -> Caller: ...


@dataclass
class DashboardSources:
    """What the composition root builds for the dashboard; each None where this process has no such source."""

    audit: AuditView | None = None
    drift: DriftHistory | None = None
    failures: FailureWindows | None = None
    loops: LoopRecords | None = None
    promoter: Promoter | None = None
    runs: FlowRuns | None = None
    links: dict[str, str] = field(default_factory=dict)
    """``mlflow`` and ``prefect``: base URLs of their UIs."""
