"""The one error family of examlops.

Adapters translate third-party exceptions (MLflow's ``MlflowException``, redis-py's and httpx's errors)
into these, chained with ``from exc``. HTTP status codes live only in ``api/`` and exit codes only in
``cli/``; what an error *means* lives here, as class attributes:

- ``model_failure``: the model failed while predicting. Seed 000's table: only these count toward the
  retrain trigger (a 422 does not, nor does a model that is not found or a pipeline that is unreachable).
- ``retryable``: doing the same thing again may succeed (a dependency that
  was down, a transport error). Validation never is.

::

    ExamlopsError
    ├── ConfigError                     settings or files that cannot be used
    │   └── CatalogError (ValueError)   a catalog YAML names a bad field
    ├── InvalidInput (ValueError)       the payload does not match the schema (422)
    │   └── PayloadTooLarge             the body is over the limit (413)
    ├── NotFound (LookupError)
    │   ├── ModelNotFound               no such model in the catalog or registry
    │   ├── AliasNotFound               the model has no such alias
    │   ├── VersionNotFound             the model has no such version
    │   ├── TaskNotFound                no task of that name is in the task map
    │   └── JobNotFound                 no such offline job, or one the caller may not see
    ├── Unauthenticated                 no credential, or one that is unknown, revoked or malformed (401)
    ├── Forbidden                       a known identity lacks the permission it names (403)
    ├── Conflict                        a change that contradicts the current state
    ├── NotReady                        the hot set is not loaded yet (503)
    ├── DeadlineExceeded                the caller's deadline passed before the work ran
    ├── Refused                         no placement could meet the budget (early), or it ran out queued (late)
    ├── InferenceFailed                 the model raised or returned nothing  [model_failure]
    │   └── InferenceTimeout            the prediction ran past the hard limit [model_failure]
    ├── ModelLoadError                  a version could not be loaded; the old one keeps serving
    │   └── ModelLoadTimeout            it did not load within its deadline (a busy cluster)  [retryable]
    ├── PromotionIncomplete             an alias moved, but some serving instance does not serve it yet
    ├── SchemaNotCurrent                the SQL database is not at this release's schema revision
    ├── ServiceError                    `exa up` could not run a service
    │   ├── PortInUse                   a port it needs is taken (names the setting to change)
    │   ├── ServiceStartFailed          a service did not become ready (carries its log tail)
    │   │   └── ServiceExited           a service exited on its own
    │   └── AlreadyRunning (Conflict)   another `exa up` owns this state folder
    └── DependencyUnavailable (ConnectionError)   [retryable]
        ├── RegistryUnavailable         MLflow cannot be reached
        ├── StoreUnavailable            Redis or SQL cannot be reached
        ├── PipelineUnavailable         the serving process cannot be reached
        └── WorkerLost                  a predict worker died under a call
"""

from __future__ import annotations

from typing import ClassVar


class ExamlopsError(Exception):
    """Root of every error examlops raises on purpose."""

    model_failure: ClassVar[bool] = False
    retryable: ClassVar[bool] = False
    code: ClassVar[str] = "examlops_error"

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.field = field

    def __str__(self) -> str:
        return self.message


class ConfigError(ExamlopsError):
    code = "config_error"


class CatalogError(ConfigError, ValueError):
    """A catalog YAML that cannot be used; the message names the file and the field."""

    code = "catalog_error"

    def __init__(self, message: str, *, file: str | None = None, field: str | None = None) -> None:
        where = ": ".join(part for part in (file, field) if part)
        super().__init__(f"{where}: {message}" if where else message, field=field)
        self.file = file


class InvalidInput(ExamlopsError, ValueError):
    """The payload does not match the model's schema: a 422, never a model failure."""

    code = "invalid_input"


class PayloadTooLarge(InvalidInput):
    code = "payload_too_large"


class NotFound(ExamlopsError, LookupError):
    code = "not_found"


class ModelNotFound(NotFound):
    code = "model_not_found"


class AliasNotFound(NotFound):
    code = "alias_not_found"


class VersionNotFound(NotFound):
    code = "version_not_found"


class TaskNotFound(NotFound):
    """The task map has no such task: the caller named a task the site does not serve."""

    code = "unknown_task"


class JobNotFound(NotFound):
    """No offline job of that id that the caller may see: another identity's job reads as one that does
    not exist, so its existence is not disclosed."""

    code = "job_not_found"


class Unauthenticated(ExamlopsError):
    """No usable credential. The message is the same whether the token was missing, unknown, revoked
    or malformed: a caller probing tokens learns nothing from the refusal. Never a model failure."""

    code = "unauthenticated"

    def __init__(self, message: str = "a valid bearer token is required") -> None:
        super().__init__(message)


class Forbidden(ExamlopsError):
    """A known identity asked for something its role or lists do not allow; ``permission`` names what it lacks."""

    code = "forbidden"

    def __init__(self, message: str, *, permission: str) -> None:
        super().__init__(message)
        self.permission = permission


class Conflict(ExamlopsError):
    code = "conflict"


class NotReady(ExamlopsError):
    code = "not_ready"
    retryable = True


class DeadlineExceeded(ExamlopsError):
    code = "deadline_exceeded"


class Refused(ExamlopsError):
    """The call's budget cannot be met: a normal outcome, not a failure (seed 001).

    ``reason`` is ``"budget"`` for an early refusal (the estimate exceeded the budget; nothing was queued)
    or ``"late"`` (the budget ran out, or would before an answer, while queued; it never reached a worker).
    ``estimate_ms`` is the estimated answer time that decided an early refusal; ``retry_after_s`` how long
    the caller should wait before asking again (never at once: the pool has just said it is full).
    ``budget_ms`` and ``deadline`` are the refused call's: the budget it declared (or its task's default)
    and the UNIX time its budget (or deadline) ends, so that a refusal says what remained of the budget
    as an answer does (``of_call``; serving notes them on every refusal it raises).
    """

    code = "refused"

    def __init__(
        self,
        message: str,
        *,
        reason: str = "budget",
        estimate_ms: float | None = None,
        retry_after_s: float = 1.0,
        budget_ms: float | None = None,
        deadline: float | None = None,
    ) -> None:
        super().__init__(message)
        self.reason = reason
        self.estimate_ms = estimate_ms
        self.retry_after_s = retry_after_s
        self.budget_ms = budget_ms
        self.deadline = deadline

    def of_call(self, budget_ms: float | None, deadline: float | None) -> Refused:
        """This refusal, noting the budget and deadline of the call it refuses; returns itself."""
        self.budget_ms, self.deadline = budget_ms, deadline
        return self


class InferenceFailed(ExamlopsError):
    """The model raised or returned an empty prediction: counts toward the retrain trigger."""

    code = "inference_failed"
    model_failure = True


class InferenceTimeout(InferenceFailed):
    """The prediction ran past the hard limit; its worker was replaced."""

    code = "inference_timeout"


class ModelLoadError(ExamlopsError):
    """A model version could not be loaded (missing artifact, corrupt file, wrong input size)."""

    code = "model_load_error"


class ModelLoadTimeout(ModelLoadError):
    retryable = True


class PromotionIncomplete(ExamlopsError):
    """The alias moved in the registry (that stays done), but some serving instances did not confirm it.

    ``lagging`` maps each instance URL that did not report the new version in time to what it
    reported instead (its version, a refusal, or why it could not be reached); ``confirmed``
    lists the ones that did.
    """

    code = "promotion_incomplete"

    def __init__(self, message: str, *, confirmed: tuple[str, ...] = (), lagging: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.confirmed = confirmed
        self.lagging = dict(lagging or {})


class SchemaNotCurrent(ExamlopsError):
    """The SQL database is not at the schema revision this release needs; the message says what to run."""

    code = "schema_not_current"


class DependencyUnavailable(ExamlopsError, ConnectionError):
    """A service we depend on cannot be reached; trying again later may work."""

    code = "dependency_unavailable"
    retryable = True


class RegistryUnavailable(DependencyUnavailable):
    code = "registry_unavailable"


class StoreUnavailable(DependencyUnavailable):
    code = "store_unavailable"


class PipelineUnavailable(DependencyUnavailable):
    code = "pipeline_unavailable"


class WorkerLost(DependencyUnavailable):
    """A predict worker died while it held a call; routing retries it elsewhere."""

    code = "worker_lost"


class ServiceError(ExamlopsError):
    code = "service_error"


class PortInUse(ServiceError):
    code = "port_in_use"


class ServiceStartFailed(ServiceError):
    code = "service_start_failed"

    def __init__(self, message: str, *, log_tail: str = "") -> None:
        super().__init__(message)
        self.log_tail = log_tail


class ServiceExited(ServiceStartFailed):
    code = "service_exited"


class AlreadyRunning(ServiceError, Conflict):
    code = "already_running"


def error_class(code: object) -> type[ExamlopsError] | None:
    """The error class whose ``code`` is ``code`` (a reply's), or None when no class has it."""
    pending: list[type[ExamlopsError]] = [ExamlopsError] if isinstance(code, str) else []
    while pending:
        if (kind := pending.pop()).code == code:
            return kind
        pending += kind.__subclasses__()
    return None


def error_of(code: object, message: str) -> ExamlopsError:
    """An error of the class ``code`` names, with ``message``; a plain ``ExamlopsError`` for an unknown code."""
    return (error_class(code) or ExamlopsError)(message)
