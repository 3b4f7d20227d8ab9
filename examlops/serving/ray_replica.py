"""One replica of a model's Ray Serve deployment: the versions it holds, and batched predictions.

The Ray engine runs one deployment per catalog model (``ray_runtime``). Every replica holds the versions
named in the deployment's ``user_config`` (``{"versions": {key: token}}``, the token of the version's
artifact in the ingress's store, ``ray_artifacts``; never a path, which another node would not have): Ray
calls ``reconfigure`` on each replica when the config changes and on a new replica's start, without
restarting it and while it keeps answering. ``reconfigure`` loads the versions it lacks FIRST (fetched
through Ray and unpacked locally), then drops the ones the config no longer names, so a swap never leaves
a replica without the version its traffic is routed to. ``reconfigure`` never raises (Ray would stop a
replica whose reconfigure raised and start new ones with the same config until the deployment failed,
taking the model's healthy versions offline): each replica reports its outcome for every version it
loaded or failed to load (``report``: to the artifact store) and keeps it for ``state``; the ingress
reads the reports of every running replica before it calls a version loaded, and refuses and takes out
a version that failed on one. A replica started later (Ray replacing one, or autoscaling) gets the same
``reconfigure`` with the config's versions before it takes calls; one that cannot load a version the
ingress already serves fails its health check (after one more try) and Ray starts another.

``predict((key, rows))`` is batched with ``@serve.batch``: calls queue until their rows reach the
batch size or the batch wait passes (the Ray engine binds a wait of 0, as the ingress already batched:
a batch is then the calls queued when the replica looks; the ingress's micro-batches of several requests each
count by their rows), and the batch runs one ``predict`` per version in a worker thread so that the
replica keeps answering health checks meanwhile. Each call gets an ``Outcome``: ``("ok", values)``,
``("missing", reason)`` for a version this replica does not hold, ``("failed", reason)`` when the
model raised or returned a wrong count or a non-finite value (the calls of other versions in the same
batch are not affected), or ``("timeout", reason)`` for every call of a batch still predicting after
``timeout_s``. A thread cannot be killed, so a replica whose prediction timed out fails its next health
check (``check_health``): Ray replaces the process, and with it the stuck thread, as the predict pool
replaces a stuck worker. Plain tuples: they cross process boundaries without our classes.

Imports ray: only the Ray engine loads this module.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Literal

import numpy as np
from ray import serve

from examlops.registry.loader import expected_features
from examlops.serving.ports import Predictor, Rows
from examlops.serving.ray_artifacts import ShippedLoader, is_confirmed, report_outcome

log = logging.getLogger(__name__)

Call = tuple[str, Rows]
"""One predict call: the version's key and its rows."""
Outcome = tuple[Literal["ok", "missing", "failed", "timeout"], Any]
"""``("ok", float64 array)`` or ``("missing" | "failed" | "timeout", reason)``."""
DEFAULT_MAX_ROWS = 32
DEFAULT_WAIT_S = 0.05


def rows_in(calls: Sequence[Call]) -> int:
    """The size of a batch for ``@serve.batch``: rows, not calls."""
    return sum(len(rows) for _, rows in calls)


def predict_calls(models: Mapping[str, Predictor], calls: Sequence[Call]) -> list[Outcome]:
    """The outcome of each call, in order: one ``predict`` per version over the rows of all its calls."""
    outcomes: list[Outcome | None] = [None] * len(calls)
    groups: dict[str, list[int]] = {}
    for i, (key, _) in enumerate(calls):
        groups.setdefault(key, []).append(i)
    for key, members in groups.items():
        model = models.get(key)
        if model is None:
            for i in members:
                outcomes[i] = ("missing", f"this replica does not hold {key}")
            continue
        stacked = np.concatenate([np.asarray(calls[i][1], dtype=np.float64) for i in members])
        try:
            values = np.asarray(model.predict(stacked), dtype=np.float64).reshape(-1)
            if values.shape[0] != stacked.shape[0]:
                raise ValueError(f"{values.shape[0]} predictions for {stacked.shape[0]} rows")
            if not np.all(np.isfinite(values)):
                raise ValueError("a prediction is not finite")
        except Exception as exc:
            reason = f"{key} failed: {type(exc).__name__}: {exc}"[:500]
            for i in members:
                outcomes[i] = ("failed", reason)
            continue
        start = 0
        for i in members:
            count = len(calls[i][1])
            outcomes[i] = ("ok", values[start : start + count])
            start += count
    return [o if o is not None else ("failed", "no outcome") for o in outcomes]


class ModelReplica:
    """One replica's versions and its batched predict (contract above).

    ``loader`` turns ``(key, token)`` into a model (``ShippedLoader``), ``report`` tells the store each
    version's outcome (``report_outcome``), ``confirmed`` asks it whether the ingress serves a version
    (``is_confirmed``); tests pass their own.
    """

    def __init__(
        self,
        model: str,
        max_rows: int = DEFAULT_MAX_ROWS,
        max_wait_s: float = DEFAULT_WAIT_S,
        timeout_s: float = 30.0,
        loader: Callable[[str, str], Predictor] | None = None,
        report: Callable[[str, str, str | None], Awaitable[None]] = report_outcome,
        confirmed: Callable[[str, str], Awaitable[bool]] = is_confirmed,
    ) -> None:
        self._model = model
        self._timeout_s = timeout_s
        self._stuck: str | None = None
        self._loader = loader if loader is not None else ShippedLoader()
        self._report = report
        self._confirmed = confirmed
        self._versions: dict[str, str] = {}  # the config's, as the last reconfigure named them
        self._models: dict[str, Predictor] = {}
        self._locations: dict[str, str] = {}
        self._failed: dict[str, tuple[str, str]] = {}  # key -> (location, reason)
        # ``@serve.batch`` adds these setters to the method; its annotations only say it is a callable.
        batched: Any = self.predict
        batched.set_max_batch_size(max_rows)
        batched.set_batch_wait_timeout_s(max_wait_s)

    async def reconfigure(self, config: Mapping[str, Any]) -> None:
        versions: dict[str, str] = dict(config.get("versions", {}))
        self._versions = versions
        for key, token in versions.items():
            if self._locations.get(key) != token:
                await self._load(key, token)
        for key in [k for k in self._models if k not in versions]:
            del self._models[key], self._locations[key]
        for key in [k for k in self._failed if k not in versions]:
            del self._failed[key]

    async def _load(self, key: str, token: str) -> bool:
        """Load one version and report the outcome; True when it loaded (and the config still names it)."""
        try:
            model = await asyncio.to_thread(self._loader, key, token)
        except Exception as exc:
            reason = f"{type(exc).__name__}: {exc}"[:500]
            log.warning("could not load %s (%s): %s", key, token, reason)
            if self._versions.get(key) == token:
                self._failed[key] = (token, reason)
            await self._report(key, token, reason)
            return False
        if self._versions.get(key) != token:  # a reconfigure took it out meanwhile
            return False
        self._models[key], self._locations[key] = model, token
        self._failed.pop(key, None)
        await self._report(key, token, None)
        return True

    async def state(self, key: str) -> tuple[bool, int | None, str | None]:
        """``(loaded, input columns the model declares, why it failed)`` of one version on this replica."""
        model = self._models.get(key)
        if model is not None:
            return True, expected_features(model), None
        failed = self._failed.get(key)
        return False, None, failed[1] if failed else f"{key} is not in the deployment's versions"

    async def check_health(self) -> None:
        """Ray's health check: fails once a prediction outlived its limit, or while a version the ingress
        serves (confirmed in the store) failed to load here and fails again when tried once more, so that Ray
        replaces this process. A failed version still on trial does not count: the ingress refuses it."""
        if self._stuck is not None:
            raise RuntimeError(self._stuck)
        for key, (token, _) in list(self._failed.items()):
            if not await self._confirmed(key, token) or await self._load(key, token):
                continue
            failed = self._failed.get(key)
            if failed is not None:
                raise RuntimeError(f"{key} is served but could not be loaded here ({failed[1]}); replacing the replica")

    @serve.batch(max_batch_size=DEFAULT_MAX_ROWS, batch_wait_timeout_s=DEFAULT_WAIT_S, batch_size_fn=rows_in)
    async def predict(self, calls: list[Call]) -> list[Outcome]:
        return await self.predict_batch(calls)

    async def predict_batch(self, calls: list[Call]) -> list[Outcome]:
        """One batch, as ``predict`` runs it (``@serve.batch`` needs a running replica; this does not)."""
        models = dict(self._models)  # the versions of this batch, whatever a reconfigure does meanwhile
        work = asyncio.ensure_future(asyncio.to_thread(predict_calls, models, calls))
        # The watchdog holds even when the caller gives up first and Ray cancels this batch: the thread
        # runs on either way, and only replacing the replica ends it.
        watchdog = asyncio.get_running_loop().call_later(self._timeout_s, self._overdue, work, calls)
        work.add_done_callback(lambda _: watchdog.cancel())
        work.add_done_callback(_consume)  # a late result or error has no one left to read it
        done, _ = await asyncio.wait({work}, timeout=self._timeout_s)
        if not done:
            self._overdue(work, calls)
            return [("timeout", self._stuck)] * len(calls)
        return work.result()

    def _overdue(self, work: asyncio.Future[list[Outcome]], calls: list[Call]) -> None:
        if work.done() or self._stuck is not None:
            return
        keys = sorted({key for key, _ in calls})
        self._stuck = f"a prediction of {', '.join(keys)} ran past {self._timeout_s:g} s; replacing the replica"
        log.error("%s", self._stuck)


def _consume(future: asyncio.Future[list[Outcome]]) -> None:
    if not future.cancelled():
        future.exception()
