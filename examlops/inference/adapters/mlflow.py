"""The mlflow adapter: ``mlflow models serve``'s scoring server, ``POST /invocations`` (MLflow 2 and 3).

One scoring server serves one model: each route's target names its server (``url``, else the adapter's
``url``), and all of them share the adapter's one client. The target says how rows are sent
(``MlflowTarget.format``):

- ``tensor`` (a tensor signature): ``{"inputs": [[...], ...]}``, each row flattened by
  ``codec.row_vector`` in ``fields`` order (None: the row's, which is the spec input's).
- ``dataframe`` (a column signature): ``{"dataframe_split": {"columns": [...], "data": [[...], ...]}}``;
  with ``columns`` the flattened vector is split into those columns (as many as its width), without them
  the columns are the row's fields and their values go as they are (a list stays one array-valued cell).

The reply is ``{"predictions": [...]}`` (MLflow 2 and 3; a bare list, MLflow 1's, is taken too), one
prediction a row: a scalar, a vector (``codec.output_row``), or a record when the model returns a
DataFrame (its values are taken by the output field names, or the only one for a one-field output).
One call carries every row: native batching, no cap (``max_batch`` declares one), no streaming.

Failures: the scoring server answers 400 with ``{"error_code", "message"}`` both for a request it cannot
parse or that fails the signature (``VALIDATION``) and for a model that raised ("unexpected error while
evaluating the model": ``MODEL_FAILURE``); its 504 (``MLFLOW_SCORING_SERVER_REQUEST_TIMEOUT``) and the
deadline are ``TIMEOUT``; the rest as ``wire`` maps statuses. The server's message is never passed on: it
echoes the input (``Failed to predict data '<the rows>'``); the code is ``mlflow_<error_code>``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import httpx

from examlops.inference.adapters import codec
from examlops.inference.adapters.http_adapter import HttpAdapter
from examlops.inference.adapters.remote_config import MlflowRoute, MlflowSettings, settings_of, targets_of
from examlops.inference.adapters.wire import HttpBackend, error_of, malformed
from examlops.inference.errors import InferenceError, Kind
from examlops.inference.ports import Call, Capabilities, Row

BACKEND = "mlflow"
MODEL_RAISED = "unexpected error while evaluating the model"
"""What MLflow's scoring server says (with a 400) when the model's predict raised."""


@dataclass(frozen=True, slots=True)
class MlflowTarget:
    """How a route's rows go to a scoring server: ``url`` (else the adapter's), the body's format."""

    adapter: ClassVar[str] = BACKEND
    url: str | None = None
    format: Literal["tensor", "dataframe"] = "tensor"
    fields: tuple[str, ...] | None = None
    columns: tuple[str, ...] | None = None
    """``dataframe`` only: the column names of the flattened vector."""
    outputs: tuple[str, ...] = ("prediction",)

    def __post_init__(self) -> None:
        if self.format not in ("tensor", "dataframe"):
            raise ValueError("an mlflow target's format is tensor or dataframe")
        if self.columns is not None and self.format != "dataframe":
            raise ValueError("columns belong to the dataframe format")

    @classmethod
    def of(cls, raw: MlflowTarget | Mapping[str, Any]) -> MlflowTarget:
        """A target, or one from a wiring file's mapping: ``url``, ``format``, ``fields``, ``columns``,
        ``outputs``."""
        if isinstance(raw, MlflowTarget):
            return raw
        return cls(**MlflowRoute.model_validate(dict(raw)).model_dump())

    def body(self, rows: Sequence[Row]) -> dict[str, Any]:
        if self.format == "tensor":
            return {"inputs": codec.rows_matrix(rows, self.fields)}
        if self.columns is not None:
            matrix = codec.rows_matrix(rows, self.fields)
            if matrix and len(matrix[0]) != len(self.columns):
                raise InferenceError(
                    Kind.VALIDATION,
                    f"rows flatten to {len(matrix[0])} values for {len(self.columns)} columns",
                    code="inference_input_ragged",
                )
            return {"dataframe_split": {"columns": list(self.columns), "data": matrix}}
        names = list(self.fields or rows[0])
        missing = [name for row in rows for name in names if name not in row]
        if missing:
            raise InferenceError(Kind.VALIDATION, f"{missing[0]}: missing from the row", code="inference_input_missing")
        return {"dataframe_split": {"columns": names, "data": [[row[name] for name in names] for row in rows]}}


class MlflowAdapter(HttpAdapter[MlflowTarget]):
    """Scoring servers: each route's target names its own (``url``), else every route goes to ``url``."""

    backend = BACKEND

    def __init__(
        self,
        url: str | None,
        routes: Mapping[str, MlflowTarget],
        *,
        headers: Mapping[str, str] | None = None,
        max_batch: int | None = None,
        default_timeout_s: float = 30.0,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self._urls = {route: (target.url or url or "").rstrip("/") for route, target in routes.items()}
        unplaced = sorted(route for route, where in self._urls.items() if not where)
        if unplaced:
            raise ValueError(f"no scoring server url for the routes {unplaced}")
        self.capabilities = Capabilities(native_batching=True, max_batch=max_batch)
        # One client for every scoring server (one per model): requests name absolute URLs.
        http = HttpBackend(
            "", backend=BACKEND, headers=headers, default_timeout_s=default_timeout_s, transport=transport
        )
        super().__init__(routes, http)

    async def predict_batch(self, route: str, rows: Sequence[Row], call: Call) -> Sequence[Row]:
        target = self.batch_target(route, rows)
        if not rows:
            return []
        with self.blamed(route):
            body = target.body(rows)
        response = await self._http.post(f"{self._urls[route]}/invocations", call, json=body)
        if response.status_code != 200:
            raise _failure(response, route)
        try:
            data = response.json()
        except ValueError as exc:
            raise malformed("not JSON", backend=BACKEND, route=route) from exc
        predictions = data.get("predictions") if isinstance(data, dict) else data
        if not isinstance(predictions, list):
            raise malformed("no predictions", backend=BACKEND, route=route)
        with self.blamed(route):
            values = [_value(p, target.outputs) for p in predictions]
            return codec.output_rows(values, target.outputs, len(rows))


def _value(prediction: object, outputs: Sequence[str]) -> object:
    """A record (a DataFrame output's row) as the output fields' values; anything else as it is."""
    if not isinstance(prediction, dict):
        return prediction
    if len(outputs) == 1 and len(prediction) == 1:
        return next(iter(prediction.values()))
    try:
        return [prediction[name] for name in outputs]
    except KeyError as exc:
        raise InferenceError(
            Kind.VALIDATION, f"the model's output has no column {exc.args[0]!r}", code="inference_output_mismatch"
        ) from None


def _failure(response: httpx.Response, route: str) -> InferenceError:
    try:
        body = response.json()
    except ValueError:
        body = None
    if not isinstance(body, dict) or "error_code" not in body:
        return error_of(response, backend=BACKEND, route=route)
    error_code = str(body.get("error_code", "")).lower()
    message = str(body.get("message", ""))
    kind = error_of(response, backend=BACKEND, route=route).kind
    if response.status_code == 400 and MODEL_RAISED in message:
        kind = Kind.MODEL_FAILURE
    what = (
        "the model raised"
        if kind is Kind.MODEL_FAILURE
        else f"the scoring server refused the call (HTTP {response.status_code})"
    )
    return InferenceError(kind, what, code=f"mlflow_{error_code}" if error_code else None, backend=BACKEND, route=route)


def mlflow_adapter(
    targets: Mapping[str, MlflowTarget | Mapping[str, Any]],
    settings: Mapping[str, Any],
    *,
    transport: httpx.AsyncBaseTransport | None = None,
) -> MlflowAdapter:
    """The wiring's factory (``register_adapter("mlflow", mlflow_adapter)``): every route wired to mlflow
    (each naming its server's ``url``, or sharing ``settings["url"]``), and the shared ``settings``: ``url``,
    ``max_batch``, ``default_timeout_s``."""
    shared = settings_of(MlflowSettings, BACKEND, settings)
    return MlflowAdapter(
        shared.url,
        targets_of(BACKEND, MlflowTarget.of, targets),
        max_batch=shared.max_batch,
        default_timeout_s=shared.default_timeout_s,
        transport=transport,
    )
