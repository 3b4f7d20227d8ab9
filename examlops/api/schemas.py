"""Request and reply bodies of the HTTP API: where untrusted input meets pydantic.

Every float in an embedding must be a finite JSON number: NaN, Infinity,
numbers that overflow to infinity, strings, booleans, nulls and nested lists
are refused. Unknown fields are refused. The length of the embedding is the
catalog's business and is checked by the feature transformer.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr

from examlops.core.budget import MAX_BUDGET_MS

FiniteFloat = Annotated[float, Field(strict=True, allow_inf_nan=False)]
ShortText = Annotated[StrictStr, Field(min_length=1, max_length=128)]

MAX_EMBEDDING_VALUES = 8192
"""A ceiling well above any catalog's embedding, so a huge list is refused by pydantic before it is copied."""
MAX_VERSION = 2**31 - 1
"""The largest registry version a caller may pin: MLflow keeps versions in a 32-bit SQL integer on Postgres."""
MAX_NODE_COUNT = 2**53
"""A ceiling for any catalog: the node count becomes a float64 feature, exact only up to 2**53. A model's
own bound is its catalog maximum, checked by the feature transformer."""


MAX_STREAM_INSTANCES = 10_000
"""The most instances one stream may carry (the body limit, ``serving.max_body_bytes``, applies too);
larger sets are offline work."""

Deadline = Annotated[float, Field(strict=True, allow_inf_nan=False, gt=0)]
BudgetMs = Annotated[float, Field(allow_inf_nan=False, gt=0, le=MAX_BUDGET_MS)]


class Instance(BaseModel):
    """One instance to predict: the input of a call, or one row of a stream."""

    model_config = ConfigDict(extra="forbid")

    embedding: Annotated[list[FiniteFloat], Field(max_length=MAX_EMBEDDING_VALUES)]
    """Exactly as many finite numbers as the model's catalog entry says (384 for the demo models)."""
    node_count: Annotated[StrictInt, Field(ge=1, le=MAX_NODE_COUNT)]
    """The mesh node count, a positive integer within the model's catalog bounds."""
    job_id: ShortText | None = None
    """Kept as metadata and echoed in the reply."""


class CallBody(Instance):
    """The input of one call, whatever names the model: what every inference body holds."""

    model_config = ConfigDict(extra="forbid")

    user_id: ShortText | None = None
    """Kept as metadata."""
    deadline: Deadline | None = None
    """Absolute UNIX time after which the caller no longer waits; work past it is refused, never done."""
    budget_ms: BudgetMs | None = None
    """How long the caller can wait, in milliseconds from when serving received the call (the earlier of it
    and ``deadline`` wins). A call that cannot be answered within it is refused at once (503, ``refused``).
    Unset: the ``X-Examlops-Budget-Ms`` header, else the task's default budget, else no limit."""


class TaskInferBody(CallBody):
    """One call by task (`POST /v1/tasks/{task}/infer`): the site's task map picks model and alias.

    No ``model``, ``alias`` or ``version``: a caller that names a task names no model, so nothing it sends
    can outlive a remap (a pinned version would name a version of whichever model the task mapped to).
    """

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={"example": {"embedding": [0.01] * 4, "node_count": 12, "job_id": "j-1"}},
    )


class PredictBody(CallBody):
    """One prediction through the direct API (`POST /v1/models/{model}/predict`)."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={"example": {"alias": "Production", "embedding": [0.01] * 4, "node_count": 12}},
    )

    alias: ShortText | None = None
    """Production, Canary or Staging, any case. Unset: the model's default alias and its traffic split."""
    version: Annotated[StrictInt, Field(ge=1, le=MAX_VERSION)] | None = None
    """Pin a raw registry version (1 to 2**31-1) instead of an alias (kept loaded in an LRU of recent pins)."""


class InferBody(PredictBody):
    """One prediction through the inference pipeline (`POST /infer-pipeline/infer`), the route the bridge calls."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={"example": {"model": "JPCP", "embedding": [0.01] * 4, "node_count": 12, "job_id": "j-1"}},
    )

    model: ShortText
    """The catalog name of the model, any case."""


class InferReply(BaseModel):
    task: str | None = None
    """The task the caller named (`/v1/tasks/{task}/infer` only; left out of the model routes' replies)."""
    model: str
    alias: str
    version: str
    run_id: str | None
    prediction: float
    error: None = None
    job_id: str | None = None
    budget_ms: float | None = None
    """The budget the call declared or its task's default; None: the call had none."""
    budget_remaining_ms: float | None = None
    """What was left of the budget (or deadline) when the answer was ready."""


class ErrorReply(BaseModel):
    """Every error: a message, a prediction of 0.0 (seed 000), and what kind of error it was."""

    error: str
    prediction: float = 0.0
    code: str
    field: str | None = None
    inference_failed: bool = False
    model: str | None = None
    job_id: str | None = None
    permission: str | None = None
    """On a 403: the permission the identity lacks."""
    refused: str | None = None
    """On a refusal (503, code ``refused``): ``budget`` when no placement could meet the budget (answered at
    once, nothing queued), ``late`` when it ran out, or would before an answer, while the call was queued
    (it was never run)."""
    estimate_ms: float | None = None
    """On an early refusal: the estimated answer time, with the estimate's margin, that decided it."""
    budget_ms: float | None = None
    """On a refusal, as on an answer: the budget the call declared or its task's default; None: it had none."""
    budget_remaining_ms: float | None = None
    """On a refusal, as on an answer: what was left of the budget (or deadline) when the refusal was sent
    (negative once it has passed); None: the call had neither."""


class HotSetEntry(BaseModel):
    model: str
    alias: str | None
    version: str | None
    run_id: str | None
    loaded_at: float | None
    state: str
    reason: str | None = None


class TrafficReply(BaseModel):
    model: str
    weights: dict[str, int]
    """Alias -> percent. Empty: all traffic to the default alias goes to that alias."""


class ReadyReply(BaseModel):
    ready: bool
    models: list[HotSetEntry]


class ReloadBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: ShortText | None = None
    """Reload one model (any case); unset, every model."""


class ReloadChangeReply(BaseModel):
    model: str
    alias: str
    old_version: str | None
    new_version: str | None
    outcome: str
    """swapped, loaded, removed, refused (the old version keeps serving) or unreachable (MLflow is down)."""
    reason: str | None = None


class ReloadReply(BaseModel):
    changes: list[ReloadChangeReply]
    """What moved; empty when every alias in memory already matched MLflow."""


class TaskStreamBody(BaseModel):
    """Many instances through one stream (`POST /v1/tasks/{task}/stream`); the budget governs the whole."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={"example": {"instances": [{"embedding": [0.01] * 4, "node_count": 12}], "budget_ms": 2000}},
    )

    instances: Annotated[list[Instance], Field(min_length=1, max_length=MAX_STREAM_INSTANCES)]
    """The instances, answered in this order (each chunk names the index of its first)."""
    user_id: ShortText | None = None
    """Kept as metadata."""
    deadline: Deadline | None = None
    """Absolute UNIX time after which the caller no longer waits for any of the stream."""
    budget_ms: BudgetMs | None = None
    """How long the caller waits for the whole stream, in milliseconds from when serving received it (the
    earlier of it and ``deadline`` wins). Unset: the ``X-Examlops-Budget-Ms`` header, else the task's default."""


class ModelStreamBody(TaskStreamBody):
    """Many instances through one stream to a model (`POST /v1/models/{model}/stream`)."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "example": {"alias": "Production", "instances": [{"embedding": [0.01] * 4, "node_count": 12}]}
        },
    )

    alias: ShortText | None = None
    """Production, Canary or Staging, any case. Unset: drawn once from the model's traffic split."""
    version: Annotated[StrictInt, Field(ge=1, le=MAX_VERSION)] | None = None
    """Pin a raw registry version instead of an alias."""


class StreamChunk(BaseModel):
    """One line of a stream: the predictions of one finished batch of consecutive instances."""

    chunk: int
    """0, 1, 2, ... in order; no chunk is skipped."""
    start: int
    """The index (in ``instances``) of the first instance answered here; the others follow in order."""
    predictions: list[float]
    model: str
    alias: str
    versions: list[str]
    """The version that answered each prediction (all the same unless a reload landed mid-chunk)."""
    job_ids: list[str | None] | None = None
    """Each instance's ``job_id``, when any instance of the chunk had one."""
    budget_remaining_ms: float | None = None
    """What was left of the stream's budget (or deadline) when the chunk was sent."""


class StreamEnd(BaseModel):
    """The last line of every stream that started."""

    done: Literal[True] = True
    answered: int
    """How many instances the chunks before this line answered (the first ``answered``, in order)."""
    instances: int
    """How many the stream asked for."""
    expired: bool = False
    """The budget ran out (or could no longer be met) before every instance was answered; the rest were
    never run."""
    budget_ms: float | None = None
    budget_remaining_ms: float | None = None
    error: ErrorReply | None = None
    """What stopped the stream, when something other than its budget did (a model failure, a bad
    instance: ``field`` names it as ``instances.<i>.<field>``); None when every instance was answered."""
