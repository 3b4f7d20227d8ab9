"""The Ray engine's predict runtime against fake deployments: redeploys, refusals, outcomes, the time limit."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest

pytest.importorskip("ray", reason="the Ray engine needs the ray extra (pip install 'examlops[ray]')")

from examlops.core.errors import InferenceFailed, InferenceTimeout, ModelLoadError, VersionNotFound, WorkerLost
from examlops.core.settings import Settings
from examlops.serving.ray_runtime import RayPredictRuntime, deployment_options


class Response:
    """An awaitable reply of a fake handle call; ``cancel`` is recorded."""

    def __init__(self, work: Any) -> None:
        self._work = work
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True

    def __await__(self) -> Any:
        return self._work().__await__()


class Method:
    def __init__(self, fn: Any, sent: list[Response]) -> None:
        self._fn, self._sent = fn, sent

    def remote(self, *args: Any) -> Response:
        async def work() -> Any:
            return await self._fn(*args)

        response = Response(work)
        self._sent.append(response)
        return response


class FakeDeployments:
    """Every model's replicas as one fake: the deployed versions, each redeploy, steerable answers."""

    def __init__(self) -> None:
        self.deployed: dict[str, dict[str, str]] = {}
        self.redeploys: list[tuple[str, dict[str, str]]] = []
        self.broken: set[str] = set()
        self.answer: Any = None
        self.sent: list[Response] = []

    def deploy(self, settings: Settings, model: str, versions: dict[str, str]) -> None:
        self.redeploys.append((model, dict(versions)))
        self.deployed[model] = dict(versions)

    def handle(self, model: str) -> Any:
        fake = self

        class Handle:
            state = Method(fake._state, fake.sent)
            predict = Method(fake._predict, fake.sent)

        return Handle()

    async def _state(self, key: str) -> tuple[bool, int | None, str | None]:
        if key in self.broken:
            return False, None, "ValueError: bad artifact"
        return True, 385, None

    async def _predict(self, call: tuple[str, Any]) -> Any:
        answer = self.answer
        if callable(answer):
            return await answer(call)
        return answer


@pytest.fixture
def fake() -> FakeDeployments:
    return FakeDeployments()


def runtime(fake: FakeDeployments, **predict: Any) -> RayPredictRuntime:
    settings = Settings(predict=predict) if predict else Settings()
    return RayPredictRuntime(settings, deploy=fake.deploy, handle=fake.handle)


async def test_a_load_redeploys_the_model_with_the_version_and_an_unload_without_it(fake: FakeDeployments) -> None:
    rt = runtime(fake)
    assert await rt.load("JPCP/1", "/a/1") == 385
    assert await rt.load("JPCP/2", "/a/2") == 385
    await rt.unload("JPCP/1")
    assert fake.redeploys == [
        ("JPCP", {"JPCP/1": "/a/1"}),
        ("JPCP", {"JPCP/1": "/a/1", "JPCP/2": "/a/2"}),
        ("JPCP", {"JPCP/2": "/a/2"}),
    ]


async def test_loads_that_wait_for_a_redeploy_are_applied_together(fake: FakeDeployments) -> None:
    rt = runtime(fake)
    await asyncio.gather(*(rt.load(f"AC/{v}", f"/a/{v}") for v in (1, 2, 3)))
    assert fake.deployed["AC"] == {"AC/1": "/a/1", "AC/2": "/a/2", "AC/3": "/a/3"}
    assert len(fake.redeploys) < 3


async def test_a_version_the_replicas_cannot_load_is_refused_and_taken_out_again(fake: FakeDeployments) -> None:
    rt = runtime(fake)
    await rt.load("JPCP/1", "/a/1")
    fake.broken.add("JPCP/2")
    with pytest.raises(ModelLoadError, match="bad artifact"):
        await rt.load("JPCP/2", "/a/2")
    assert fake.deployed["JPCP"] == {"JPCP/1": "/a/1"}


async def test_outcomes_become_our_errors(fake: FakeDeployments) -> None:
    rt = runtime(fake)
    rows = np.zeros((2, 385))
    fake.answer = ("ok", [1.0, 2.0])
    assert list(await rt.predict("JPCP/1", rows)) == [1.0, 2.0]
    for kind, error in (("missing", VersionNotFound), ("failed", InferenceFailed), ("timeout", InferenceTimeout)):
        fake.answer = (kind, "why")
        with pytest.raises(error, match="why"):
            await rt.predict("JPCP/1", rows)

    async def unreachable(call: Any) -> Any:
        raise ConnectionError("no replica")

    fake.answer = unreachable
    with pytest.raises(WorkerLost):
        await rt.predict("JPCP/1", rows)


async def test_a_call_past_the_limit_is_cancelled_and_times_out(fake: FakeDeployments) -> None:
    rt = runtime(fake, timeout_s=0.05)

    async def forever(call: Any) -> Any:
        await asyncio.sleep(3600)

    fake.answer = forever
    with pytest.raises(InferenceTimeout, match=r"0\.05 s"):
        await rt.predict("JPCP/1", np.zeros((1, 385)))
    assert fake.sent[-1].cancelled


def test_replicas_come_from_settings_fixed_or_autoscaled() -> None:
    fixed = deployment_options(Settings(ray={"num_replicas": 3, "replica_cpus": 0.25}))
    assert (fixed["num_replicas"], fixed["ray_actor_options"], "autoscaling_config" in fixed) == (
        3,
        {"num_cpus": 0.25},
        False,
    )
    scaled = deployment_options(Settings(ray={"min_replicas": 1, "max_replicas": 4, "target_ongoing_requests": 3}))
    assert "num_replicas" not in scaled
    assert scaled["autoscaling_config"] == {"min_replicas": 1, "max_replicas": 4, "target_ongoing_requests": 3.0}
