"""The sections of the settings object: one ``BaseModel`` each (``EXAMLOPS_<SECTION>__<NAME>``).

Every section forbids unknown keys and is frozen; each field's docstring is what `exa config show` prints.
The settings object itself, and the rules across sections, are ``examlops.core.settings``; the control
plane's sections (the closed loop, `exa up`) are ``examlops.core.control_sections``; where the shared
servers are (Redis, MLflow, Prefect, a Ray cluster) is ``examlops.core.server_sections``.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class Section(BaseModel):
    model_config = ConfigDict(use_attribute_docstrings=True, extra="forbid", frozen=True)


class HttpSettings(Section):
    """The bridge's HTTP client to the inference pipeline (seed 000, step 3)."""

    connect_timeout_s: float = Field(5.0, gt=0)
    """Seconds to open a connection from the bridge to the pipeline."""
    read_timeout_s: float = Field(10.0, gt=0)
    """Seconds to wait for the pipeline's reply; the hop is never retried."""


class BatchSettings(Section):
    """The feature transformer's micro-batches (seed 000, step 5)."""

    max_size: int = Field(32, ge=1)
    """A batch is flushed as soon as it holds this many requests."""
    max_wait_ms: float = Field(50.0, ge=0)
    """A batch is flushed this many milliseconds after its first request at the latest."""


class TrafficSettings(Section):
    """The model router (seed 000, step 6)."""

    rules_ttl_s: float = Field(30.0, ge=0)
    """Seconds a model's traffic rules are cached before SQL is read again."""
    route_retries: int = Field(2, ge=0)
    """Retries of a routed prediction after a transport error."""


class PredictSettings(Section):
    """The predict pool (seed 000, step 7)."""

    workers: int = Field(4, ge=1)
    """Worker processes that run predictions."""
    timeout_s: float = Field(30.0, gt=0)
    """Hard limit of one prediction; past it the request gets a 504 and the worker is replaced."""


class AdmissionSettings(Section):
    """Latency budgets and admission control at the ingress (seed 001)."""

    enabled: bool = True
    """Refuse at once a call whose estimated answer time (with the estimate's margin) exceeds its budget, and
    refuse late a queued one that could not be answered in time even alone (off: every call is queued)."""
    overhead_ms: float = Field(2.0, ge=0)
    """Milliseconds added to every estimate for what the predict time does not see (HTTP, JSON, routing)."""
    headroom: float = Field(0.3, ge=0, le=4)
    """The share by which predict work may run slower than the cost model learnt: admission counts the work
    ahead of a call, in flight and its own batch's at 1 + this (0: as learnt). Why: under overload the ingress
    takes CPU from the workers, so the calls admitted at a burst's onset were estimated too fast
    (bench/RESULTS.md, "admission counts predict work with headroom")."""
    prior_ms: float = Field(5.0, gt=0)
    """The predict time assumed for a model and batch size not observed yet."""
    horizon_s: float = Field(30.0, gt=0)
    """A call without a budget queues as if its deadline were this far off: budgeted calls go first."""
    retry_after_s: float = Field(1.0, gt=0)
    """The ``Retry-After`` of an early refusal when the queue gives no better hint (seconds)."""


class JobsSettings(Section):
    """Offline jobs (seed 001): run by serving in the gaps around interactive calls."""

    rest: float = Field(1.0, ge=0)
    """After each batch of a job, the runner rests this many times the batch's own time: the share of the
    process a job may take when interactive calls keep the pool busy (1: at most about half; 0: no rest)."""
    poll_s: float = Field(1.0, gt=0)
    """Seconds between looks for a job to run when there is none (or a paused one)."""
    lease_s: float = Field(60.0, gt=0)
    """A job is its runner's for this long after its last renewal (every third of it while the runner holds
    the job, even mid-batch): past it, after a crash or a stall, another serving process on the same
    database takes it over, and the old runner writes nothing more for it."""
    batch_size: int = Field(8, ge=1)
    """Instances a job feeds the pipeline at a time: an interactive call waits at most one predict of this
    many rows behind a job, so keep it below ``batch.max_size``. A job keeps the size it was submitted with."""


class HotSetSettings(Section):
    """Models kept in memory and how they follow MLflow (seed 000, steps 7 and 11)."""

    version_cache_size: int = Field(8, ge=0)
    """How many of the most recently pinned raw versions stay loaded."""
    reload_poll_s: float = Field(60.0, ge=0)
    """Seconds between asks to MLflow whether an alias moved; 0 turns polling off."""
    aliases: tuple[str, ...] = ("Production", "Canary", "Staging")
    """The aliases loaded at start-up, for every model that has them."""


class FailureSettings(Section):
    """The bridge's retrain trigger (seed 000, step 10)."""

    window: int = Field(50, ge=1)
    """How many of a model's last bus requests the failure rate is taken over."""
    threshold: float = Field(0.5, gt=0, le=1)
    """A failure rate at or above this over a full window asks for a retrain."""
    cooldown_s: float = Field(300.0, ge=0)
    """Seconds after a retrain request during which no other is made for that model."""


class AuditSettings(Section):
    """The audit trail's signed checkpoints in SQL (seed 000, step 9)."""

    checkpoint_every: int = Field(1000, ge=1)
    """Write a signed checkpoint every this many events (each is one SQL commit)."""
    checkpoint_interval_s: float = Field(60.0, gt=0)
    """And at least this often, in seconds, while events arrive."""
    verify_stale_s: float = Field(900.0, gt=0)
    """A stored `exa audit verify` result older than this shows as not current on the dashboard's Control page,
    never as intact (three runs of the retention flow's 5-minute schedule in ``prefect.yaml``)."""


class RecordingSettings(Section):
    """How bus jobs are recorded (seed 000, step 9): the records stream and the bridge's recording child."""

    nice: int = Field(19, ge=0, le=19)
    """How far the recording child lowers its priority once connected: added to the bridge's nice value, at
    most 19 (0 keeps the bridge's priority). On cores the bus load keeps busy, recording then runs in their
    idle time instead of taking it from the jobs."""
    batch: int = Field(256, ge=1)
    """Records a recorder writes at most in one step (one audit append, one failure-window update)."""
    linger_s: float = Field(0.1, ge=0)
    """How long a recorder that read fewer than ``batch`` records waits for more before writing them."""
    bound: int = Field(100_000, ge=1)
    """Records the stream holds at most while no recorder keeps up; past it, a served job's record is not
    written and is counted as dropped (``examlops:records:dropped``), so Redis memory stays bounded."""
    reclaim_idle_s: float = Field(60.0, gt=0)
    """A record read by a recorder and not written for this long (the recorder died) is taken by another."""
    snapshot_max_age_s: float = Field(7 * 86400.0, gt=0)
    """Drift snapshots older than this are trimmed by the retention flow, whether the drift flow read them or not."""


class TracingSettings(Section):
    """The trace of every call (issue 16): one SQL row per HTTP or bus call, written off the request path."""

    enabled: bool = True
    """Write a trace row for every call; off, replies still carry a trace id but nothing is stored."""
    payload: Literal["none", "hash", "full"] = "none"
    """What a trace keeps of the input and output: `none`, `hash` (SHA-256 of their canonical JSON, to match a
    known input without keeping it) or `full` (the canonical JSON itself)."""
    payload_retention_s: float = Field(7 * 86400.0, gt=0)
    """Seconds a trace keeps its stored input and output (hash or full); past it they are cleared."""
    retention_s: float = Field(30 * 86400.0, gt=0)
    """Seconds a trace row is kept at all; past it the row is deleted. At least ``payload_retention_s``."""
    bound: int = Field(10_000, ge=1)
    """Traces waiting to be written at most; past it a trace is dropped and counted
    (`examlops_traces_dropped_total`), never the request slowed."""
    batch: int = Field(2048, ge=1)
    """Traces written at most in one SQL transaction."""
    linger_s: float = Field(1.0, ge=0)
    """How long the writer waits for more traces when fewer than ``batch`` are waiting. Few, large batches
    cost serving less than many small ones (``bench/auth_trace_cost.py --on-setting``, figures in
    ``bench/RESULTS.md``); a trace is in SQL within about this long while the writer keeps up."""
    prune_every_s: float = Field(300.0, gt=0)
    """How often the writer applies the retention (clears expired payloads, deletes expired rows)."""
    nice: int = Field(19, ge=0, le=19)
    """How far serving's trace writer child lowers its priority once started: added to serving's nice value,
    at most 19 (0 keeps serving's priority). On cores the calls keep busy it then writes in their idle time
    instead of taking it from the calls. A writer that cannot keep up fills ``bound``: past it traces are
    dropped and counted, never a call slowed."""
    node: str = ""
    """The name this serving instance or bridge writes as the trace's node; empty: `hostname:pid`."""

    @model_validator(mode="after")
    def _payload_within_rows(self) -> TracingSettings:
        if self.payload_retention_s > self.retention_s:
            raise ValueError("payload_retention_s must not exceed retention_s (stored values go with their row)")
        return self


class BusSettings(Section):
    """The Redis bus and its bridges (seed 000, steps 1-3 and 8)."""

    concurrency: int = Field(64, ge=1)
    """Jobs one bridge serves at once; also the size of its HTTP keep-alive pool to serving."""
    block_ms: int = Field(1000, ge=1, le=5000)
    """How long a bridge's read of new jobs waits for one before it looks again (bounds how long a stop takes);
    at most 5 s, well inside the Redis clients' 10 s reply timeout."""
    handler_ttl_s: float = Field(30.0, gt=0)
    """An address whose last bridge heartbeat is older than this counts as served by nobody."""
    keepalive_s: float = Field(4.0, gt=0)
    """Seconds an idle connection to serving is kept; below serving's own keep-alive, so the hop never writes
    to a connection serving is closing."""
    reply_ttl_s: int = Field(600, ge=1)
    """Seconds a client's reply stream lives after its last reply (an abandoned client's stream vanishes)."""
    http_client: Literal["library", "aiohttp"] = "aiohttp"
    """The transport under the bridge's httpx client to serving: `aiohttp` (httpx-aiohttp's) or `library`
    (httpx's own, ~0.27 of aiohttp's bus throughput at c=32: bench/RESULTS.md)."""


class AuthSettings(Section):
    """Identities and their bearer tokens (issue 16): who may call which task and model, and take which action."""

    enabled: bool = True
    """Require a bearer token on every route but /healthz, /readyz and /metrics. Off is refused outside
    environment=development, and `exa config show` then says so in a banner."""
    cache_ttl_s: float = Field(30.0, ge=0)
    """Seconds a resolved token is cached per serving process; a revocation takes effect within this."""
    rotate_grace_s: float = Field(86400.0, ge=0)
    """Seconds the old token stays valid after `exa identity rotate` when --grace is not given."""


class ServingSettings(Section):
    """The serving process (FastAPI on uvicorn, or on Ray Serve)."""

    engine: Literal["uvicorn", "ray"] = "uvicorn"
    """What runs the pipeline: ``uvicorn`` (one process and its predict pool) or ``ray`` (Ray Serve: the same
    app as the ingress, one deployment per catalog model; needs the ``ray`` extra; see the ``ray`` section)."""
    host: str = "127.0.0.1"
    """Interface the serving process binds to."""
    port: int = Field(18001, ge=1, le=65535)
    """Port of the inference pipeline and the direct API."""
    max_body_bytes: int = Field(1024 * 1024, ge=1024)
    """Request bodies larger than this get a 413 without being read whole."""
    instances: tuple[str, ...] = ()
    """Base URLs of every serving instance that promotions must reach; empty means the local one."""
    drain_grace_s: float = Field(30.0, ge=0)
    """On SIGTERM, seconds to finish requests in flight before exiting."""
    header_timeout_s: float = Field(10.0, gt=0)
    """Seconds a request's line and headers may take to arrive, counted from the connection's first byte
    (or from its opening, for a new connection): past it the connection is closed (a 408 when part of a
    request came). Reaps slowloris connections and sockets that never send anything."""
    body_timeout_s: float = Field(30.0, gt=0)
    """Seconds a request's whole body may take to arrive once its headers are in; past it the connection is
    closed and the request abandoned. A body trickled a byte at a time cannot hold a connection longer."""
    keep_alive_s: int = Field(5, ge=1)
    """Seconds an idle keep-alive connection is kept between requests (uvicorn's ``timeout_keep_alive``);
    above ``bus.keepalive_s``, so the bridge never writes to a connection serving is closing."""
    max_connections: int = Field(1000, ge=1)
    """Open connections at most; one more is answered 503 (our error body) and closed at once. Lowered at
    start to leave room under the process's open-files limit (``RLIMIT_NOFILE`` less 128 for the predict
    pool, SQL and log files), so connections can never exhaust file descriptors."""
    collector_pause_at: int = Field(128, ge=0)
    """Calls in flight in the pipeline (each instance of a stream or of a V2 request, and each offline-job
    instance, counts as one) at which serving holds its automatic garbage collection off, until fewer than
    ``collector_pause_at // 2`` are (``core.collector.LoadGovernor``; ``examlops_gc_deferred`` is 1
    meanwhile): under a deep queue a collection walks every waiting call and frees next to nothing, while
    the event loop, and every refusal, waits for it. While held, the young generation is still collected
    each time it has grown by 500,000 net allocations (``examlops_gc_held_collections_total``). 0: never
    held off."""

    @property
    def local_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def instance_urls(self) -> tuple[str, ...]:
        return self.instances or (self.local_url,)


class LogSettings(Section):
    """The log files under the state folder (``logs/``): every service's, rotated by size."""

    max_bytes: int = Field(10 * 1024 * 1024, ge=4096)
    """A log file is rotated once it would grow past this many bytes."""
    backups: int = Field(5, ge=1)
    """Rotated files kept per log (``serving.log.1`` ... ``.5``); the oldest is deleted."""
