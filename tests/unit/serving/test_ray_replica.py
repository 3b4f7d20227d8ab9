"""A Ray model replica's versions and batched predictions, driven directly (no cluster): skipped without ray."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import numpy as np
import pytest

pytest.importorskip("ray", reason="the Ray engine needs the ray extra (pip install 'examlops[ray]')")

from examlops.serving.ray_replica import ModelReplica, predict_calls, rows_in


class Scaled:
    """A model whose prediction is its first column times ``factor``; records the rows of each call."""

    def __init__(self, factor: float) -> None:
        self.factor = factor
        self.n_features_in_ = 3
        self.calls: list[int] = []

    def predict(self, rows: Any) -> Any:
        self.calls.append(len(rows))
        return np.asarray(rows)[:, 0] * self.factor


class Raising:
    def predict(self, rows: Any) -> Any:
        raise RuntimeError("boom")


class Loader:
    """Loads ``Scaled(factor)`` from a token ``"x<factor>"``; any other token fails."""

    def __init__(self) -> None:
        self.loaded: list[str] = []

    def __call__(self, key: str, location: str) -> Scaled:
        self.loaded.append(location)
        if not location.startswith("x"):
            raise FileNotFoundError(location)
        return Scaled(float(location[1:]))


def rows(*firsts: float) -> np.ndarray:
    return np.array([[v, 0.0, 0.0] for v in firsts])


def test_one_predict_per_version_answers_each_call_with_its_own_rows_in_order() -> None:
    a, b = Scaled(1.0), Scaled(10.0)
    outcomes = predict_calls({"M/1": a, "M/2": b}, [("M/1", rows(1, 2)), ("M/2", rows(3)), ("M/1", rows(4))])
    assert [kind for kind, _ in outcomes] == ["ok", "ok", "ok"]
    assert [list(values) for _, values in outcomes] == [[1.0, 2.0], [30.0], [4.0]]
    assert (a.calls, b.calls) == ([3], [1])
    assert rows_in([("M/1", rows(1, 2)), ("M/2", rows(3))]) == 3


def test_a_failing_or_missing_version_fails_only_its_own_calls() -> None:
    outcomes = predict_calls(
        {"M/1": Scaled(1.0), "M/3": Raising()}, [("M/3", rows(1)), ("M/1", rows(2)), ("M/9", rows(3))]
    )
    assert outcomes[0][0] == "failed" and "boom" in outcomes[0][1]
    assert outcomes[1][0] == "ok"
    assert outcomes[2][0] == "missing" and "M/9" in outcomes[2][1]


def test_a_non_finite_prediction_is_a_failure() -> None:
    [(kind, reason)] = predict_calls({"M/1": Scaled(1.0)}, [("M/1", rows(float("nan")))])
    assert kind == "failed" and "not finite" in reason


async def test_reconfigure_loads_new_versions_before_dropping_old_ones_and_reports_failures_without_raising() -> None:
    loader, reports = Loader(), []

    async def report(key: str, token: str, reason: str | None) -> None:
        reports.append((key, token, reason))

    replica = ModelReplica("M", loader=loader, report=report)
    await replica.reconfigure({"versions": {"M/1": "x1"}})
    assert await replica.state("M/1") == (True, 3, None)

    # A raising reconfigure would make Ray stop this replica, and M/2 with it: the failure is reported instead.
    await replica.reconfigure({"versions": {"M/2": "x2", "M/3": "broken"}})
    assert await replica.state("M/2") == (True, 3, None)
    loaded, _, reason = await replica.state("M/3")
    assert not loaded and reason is not None and "FileNotFoundError" in reason
    loaded, _, reason = await replica.state("M/1")
    assert not loaded and reason is not None and "not in the deployment" in reason
    assert reports[:2] == [("M/1", "x1", None), ("M/2", "x2", None)]
    assert reports[2][:2] == ("M/3", "broken") and "FileNotFoundError" in str(reports[2][2])

    await replica.reconfigure({"versions": {"M/2": "x2"}})
    assert loader.loaded == ["x1", "x2", "broken"]  # a held version is not loaded again
    assert (await replica.state("M/3"))[2] == "M/3 is not in the deployment's versions"


async def quiet(key: str, token: str, reason: str | None) -> None:
    """A replica's report, dropped: these tests drive no store."""


class Sleepy:
    n_features_in_ = 3

    def predict(self, rows: Any) -> Any:
        time.sleep(0.5)
        return np.zeros(len(rows))


async def test_a_batch_past_the_limit_times_out_and_fails_the_health_check_so_ray_replaces_the_replica() -> None:
    replica = ModelReplica("M", max_wait_s=0.0, timeout_s=0.05, loader=lambda key, token: Sleepy(), report=quiet)
    await replica.reconfigure({"versions": {"M/1": "x"}})
    await replica.check_health()
    [(kind, reason), second] = await replica.predict_batch([("M/1", rows(1)), ("M/1", rows(2))])
    assert kind == "timeout" and "M/1" in reason and second[0] == "timeout"
    with pytest.raises(RuntimeError, match="replacing the replica"):
        await replica.check_health()


async def test_a_batch_cancelled_by_its_caller_still_fails_the_health_check_once_its_thread_overruns() -> None:
    replica = ModelReplica("M", timeout_s=0.05, loader=lambda key, token: Sleepy(), report=quiet)
    await replica.reconfigure({"versions": {"M/1": "x"}})
    batch = asyncio.ensure_future(replica.predict_batch([("M/1", rows(1))]))
    await asyncio.sleep(0.01)
    batch.cancel()
    await asyncio.sleep(0.1)
    with pytest.raises(RuntimeError, match="ran past"):
        await replica.check_health()


class Flaky:
    """A loader whose fetch fails while ``down`` (the store unreachable from a new node, say)."""

    def __init__(self) -> None:
        self.down, self.tries = True, 0

    def __call__(self, key: str, token: str) -> Scaled:
        self.tries += 1
        if self.down:
            raise ConnectionError("the artifact store did not answer")
        return Scaled(1.0)


async def test_a_replica_that_cannot_load_a_served_version_fails_its_health_check_after_one_more_try() -> None:
    loader, reports = Flaky(), []

    async def report(key: str, token: str, reason: str | None) -> None:
        reports.append((key, reason is None))

    async def served(key: str, token: str) -> bool:
        return True  # the ingress confirmed it before this replica started

    replica = ModelReplica("M", loader=loader, report=report, confirmed=served)
    await replica.reconfigure({"versions": {"M/1": "x1"}})  # a replica Ray started later: never raises
    with pytest.raises(RuntimeError, match="M/1 is served but could not be loaded here"):
        await replica.check_health()
    assert loader.tries == 2

    loader.down = False  # the next try heals it in place
    await replica.check_health()
    assert await replica.state("M/1") == (True, 3, None)
    assert reports == [("M/1", False), ("M/1", False), ("M/1", True)]
    await replica.check_health()
    assert loader.tries == 3


async def test_a_version_on_trial_that_fails_here_does_not_fail_the_health_check() -> None:
    loader = Flaky()

    async def on_trial(key: str, token: str) -> bool:
        return False  # the ingress is still waiting for the reports: it refuses the version itself

    replica = ModelReplica("M", loader=loader, report=quiet, confirmed=on_trial)
    await replica.reconfigure({"versions": {"M/2": "x2"}})
    await replica.check_health()
    assert loader.tries == 1
