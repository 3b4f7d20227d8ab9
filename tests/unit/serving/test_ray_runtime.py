"""The Ray engine's predict runtime against fake deployments: redeploys, refusals, outcomes, the time limit."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("ray", reason="the Ray engine needs the ray extra (pip install 'examlops[ray]')")

from examlops.core.errors import InferenceFailed, InferenceTimeout, ModelLoadError, ModelLoadTimeout, WorkerLost
from examlops.core.settings import Settings
from examlops.serving.dispatch import Capacity, predict_capacity
from examlops.serving.ray_artifacts import pack, unpack
from examlops.serving.ray_deploy import deployment_options, wait_running
from examlops.serving.ray_runtime import RayPredictRuntime


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
    """Every model's replicas as one fake: the deployed versions, each redeploy, steerable answers.

    A deploy makes each of ``replicas`` report every version to ``store``: a failure for one in ``broken``.
    """

    def __init__(self) -> None:
        self.deployed: dict[str, dict[str, str]] = {}
        self.redeploys: list[tuple[str, dict[str, str]]] = []
        self.broken: set[str] = set()
        self.answer: Any = None
        self.sent: list[Response] = []
        self.replicas = {"r1", "r2"}
        self.reporting = {"r1", "r2"}
        self.store: FakeArtifacts | None = None

    def deploy(self, settings: Settings, model: str, versions: dict[str, str]) -> None:
        self.redeploys.append((model, dict(versions)))
        self.deployed[model] = dict(versions)
        for key, token in versions.items():
            reason = "ValueError: bad artifact" if key in self.broken else None
            if self.store is not None:
                self.store.reports[(key, token)] = dict.fromkeys(self.reporting, reason)

    def running(self, model: str) -> set[str]:
        return set(self.replicas)

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


class FakeArtifacts:
    """The artifact store: a version's token is ``t:<folder's last part>``; records what is held."""

    def __init__(self) -> None:
        self.held: dict[str, str] = {}
        self.reports: dict[tuple[str, str], dict[str, str | None]] = {}
        self.confirmed: set[tuple[str, str]] = set()

    def ship(self, key: str, folder: str) -> str:
        self.held[key] = token = f"t:{folder.rsplit('/', 1)[-1]}"
        return token

    def drop(self, key: str) -> None:
        self.held.pop(key, None)
        self.confirmed = {pair for pair in self.confirmed if pair[0] != key}

    def confirm(self, key: str, token: str) -> None:
        self.confirmed.add((key, token))

    def outcomes(self, key: str, token: str) -> dict[str, str | None]:
        return dict(self.reports.get((key, token), {}))


class Model:
    n_features_in_ = 385


def check(location: str) -> Model:
    """The ingress's own load of a folder: a folder named ``broken`` cannot be loaded."""
    if location.endswith("broken"):
        raise ValueError("not a model folder")
    return Model()


@pytest.fixture
def fake() -> FakeDeployments:
    return FakeDeployments()


def runtime(
    fake: FakeDeployments, artifacts: FakeArtifacts | None = None, settings: Settings | None = None, **predict: Any
) -> RayPredictRuntime:
    settings = settings or (Settings(predict=predict) if predict else Settings())
    fake.store = store = artifacts if artifacts is not None else FakeArtifacts()
    return RayPredictRuntime(
        settings, deploy=fake.deploy, handle=fake.handle, artifacts=store, replicas=fake.running, check=check
    )


async def test_a_load_redeploys_the_model_with_the_version_and_an_unload_without_it(fake: FakeDeployments) -> None:
    store = FakeArtifacts()
    rt = runtime(fake, store)
    assert await rt.load("JPCP/1", "/a/1") == 385
    assert await rt.load("JPCP/2", "/a/2") == 385
    await rt.unload("JPCP/1")
    assert fake.redeploys == [
        ("JPCP", {"JPCP/1": "t:1"}),
        ("JPCP", {"JPCP/1": "t:1", "JPCP/2": "t:2"}),
        ("JPCP", {"JPCP/2": "t:2"}),
    ]
    assert store.held == {"JPCP/2": "t:2"}
    assert store.confirmed == {("JPCP/2", "t:2")}  # what a replica started later must load


async def test_the_replicas_config_names_artifact_tokens_never_a_local_path(fake: FakeDeployments) -> None:
    rt = runtime(fake)
    await rt.load("JPCP/1", "/var/examlops/cache/JPCP/1")
    for _, versions in fake.redeploys:
        assert all("/var/" not in token and not token.startswith("/") for token in versions.values())


async def test_loads_that_wait_for_a_redeploy_are_applied_together(fake: FakeDeployments) -> None:
    rt = runtime(fake)
    await asyncio.gather(*(rt.load(f"AC/{v}", f"/a/{v}") for v in (1, 2, 3)))
    assert fake.deployed["AC"] == {"AC/1": "t:1", "AC/2": "t:2", "AC/3": "t:3"}
    assert len(fake.redeploys) < 3


async def test_a_version_the_ingress_cannot_load_is_refused_before_any_replica_sees_it(
    fake: FakeDeployments,
) -> None:
    store = FakeArtifacts()
    rt = runtime(fake, store)
    await rt.load("JPCP/1", "/a/1")
    with pytest.raises(ModelLoadError, match="JPCP/2 could not be loaded: ValueError: not a model folder"):
        await rt.load("JPCP/2", "/a/broken")
    assert fake.redeploys == [("JPCP", {"JPCP/1": "t:1"})]
    assert store.held == {"JPCP/1": "t:1"}


async def test_a_version_a_replica_cannot_load_is_refused_with_its_reason_and_taken_out_again(
    fake: FakeDeployments,
) -> None:
    store = FakeArtifacts()
    rt = runtime(fake, store)
    await rt.load("JPCP/1", "/a/1")
    fake.broken.add("JPCP/2")
    refused = r"JPCP/2 could not be loaded on replica r[12]: ValueError: bad artifact"
    with pytest.raises(ModelLoadError, match=refused) as e:
        await rt.load("JPCP/2", "/a/2")
    assert not e.value.retryable  # the version's own failure: trying again loads the same artifact
    assert fake.deployed["JPCP"] == {"JPCP/1": "t:1"}
    assert store.held == {"JPCP/1": "t:1"}
    assert store.confirmed == {("JPCP/1", "t:1")}  # a refused version was never confirmed


async def test_a_version_is_loaded_only_once_every_running_replica_reported_it(fake: FakeDeployments) -> None:
    rt = runtime(fake, settings=Settings(ray={"deploy_timeout_s": 0.3}))
    fake.reporting = {"r1"}  # r2 runs but never says
    with pytest.raises(ModelLoadTimeout, match=r"1 of 2 running replicas of JPCP did not report loading JPCP/1"):
        await rt.load("JPCP/1", "/a/1")  # retryable: the replica may report on a later try
    assert fake.deployed["JPCP"] == {}
    fake.replicas = {"r1"}  # a replica that stopped is not waited for
    assert await rt.load("JPCP/1", "/a/1") == 385


async def test_a_deploy_that_fails_is_refused_and_taken_out_again(fake: FakeDeployments) -> None:
    rt = runtime(fake)
    await rt.load("JPCP/1", "/a/1")
    deploy = fake.deploy

    def failing(settings: Settings, model: str, versions: dict[str, str]) -> None:
        deploy(settings, model, versions)
        if "JPCP/2" in versions:
            raise ModelLoadError("Ray could not deploy examlops-model-JPCP: could not load JPCP/2")

    rt._deploy = failing
    with pytest.raises(ModelLoadError, match="could not load JPCP/2"):
        await rt.load("JPCP/2", "/a/2")
    assert fake.deployed["JPCP"] == {"JPCP/1": "t:1"}


async def test_a_refused_version_leaves_the_store_even_when_taking_it_out_of_the_replicas_fails(
    fake: FakeDeployments,
) -> None:
    store = FakeArtifacts()
    rt = runtime(fake, store)
    await rt.load("JPCP/1", "/a/1")

    def down(settings: Settings, model: str, versions: dict[str, str]) -> None:
        raise ModelLoadError("Serve's controller did not answer")

    rt._deploy = down
    with pytest.raises(ModelLoadError, match="did not answer"):
        await rt.load("JPCP/2", "/a/2")
    assert store.held == {"JPCP/1": "t:1"}
    await rt.unload("JPCP/1")  # logged, not raised; the blob goes all the same
    assert store.held == {}


class FakeStatus:
    """``serve.status()`` of one application whose statuses follow ``steps`` (the last one stays)."""

    def __init__(self, *steps: str, message: str = "") -> None:
        self.steps, self.message, self.calls = list(steps), message, 0

    def __call__(self) -> Any:
        step = self.steps[min(self.calls, len(self.steps) - 1)]
        self.calls += 1
        deployment = type("D", (), {"status": "UNHEALTHY", "message": self.message})()
        app = type("A", (), {"status": step, "message": "", "deployments": {"replica": deployment}})()
        return type("S", (), {"applications": {"examlops-model-M": app}})()


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.now += s


def test_a_deploy_returns_once_the_application_runs_even_past_a_replica_being_replaced() -> None:
    status, clock = FakeStatus("DEPLOYING", "UNHEALTHY", "DEPLOYING", "RUNNING"), Clock()
    wait_running("examlops-model-M", 10, status=status, clock=clock, sleep=clock.sleep)
    assert status.calls == 4


def test_a_deploy_that_cannot_place_its_replicas_fails_at_the_deadline_with_rays_message() -> None:
    status = FakeStatus("DEPLOYING", message="Deployment 'replica' has 1 replicas that cannot be scheduled")
    clock = Clock()
    with pytest.raises(ModelLoadTimeout, match=r"within 5 s: .*cannot be scheduled") as missed:
        wait_running("examlops-model-M", 5, status=status, clock=clock, sleep=clock.sleep)
    assert missed.value.retryable  # a busy cluster: not counted against the version
    assert 5 <= clock.now < 6


def test_a_deploy_that_failed_is_refused_with_rays_message_at_once() -> None:
    traceback = "failed to start 3 times\nTraceback (most recent call last):\n" + "  File x\n" * 200
    status = FakeStatus("DEPLOY_FAILED", message=traceback + "RuntimeError: could not load M/2: ValueError")
    clock = Clock()
    with pytest.raises(
        ModelLoadError, match=r"failed to start 3 times \.\.\. RuntimeError: could not load M/2"
    ) as failed:
        wait_running("examlops-model-M", 60, status=status, clock=clock, sleep=clock.sleep)
    assert not failed.value.retryable
    assert clock.now == 0


def test_capacity_is_the_replicas_or_the_most_autoscaling_may_start(fake: FakeDeployments) -> None:
    fixed = RayPredictRuntime(Settings(ray={"num_replicas": 2}), deploy=fake.deploy, handle=fake.handle)
    scaled = RayPredictRuntime(Settings(ray={"max_replicas": 4}), deploy=fake.deploy, handle=fake.handle)
    assert (fixed.model_capacity, scaled.model_capacity) == (2, 4)


async def test_outcomes_become_our_errors(fake: FakeDeployments) -> None:
    rt = runtime(fake)
    rows = np.zeros((2, 385))
    fake.answer = ("ok", [1.0, 2.0])
    assert list(await rt.predict("JPCP/1", rows)) == [1.0, 2.0]
    # A replica without a version the ingress holds failed to load it: re-routed, as a lost worker is.
    for kind, error in (("missing", WorkerLost), ("failed", InferenceFailed), ("timeout", InferenceTimeout)):
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


def test_the_pipeline_sizes_its_batches_in_flight_by_the_replicas_not_the_pool(fake: FakeDeployments) -> None:
    settings = Settings(predict={"workers": 1}, ray={"num_replicas": 2})
    rt = RayPredictRuntime(settings, deploy=fake.deploy, handle=fake.handle)
    assert predict_capacity(rt, settings.predict.workers) == Capacity(2, per_model=True)


def test_a_shipped_folder_unpacks_to_the_same_files_under_a_token_of_its_content(tmp_path: Path) -> None:
    folder = tmp_path / "model"
    (folder / "code").mkdir(parents=True)
    (folder / "MLmodel").write_text("flavors: {}\n")
    (folder / "code" / "x.py").write_bytes(b"X = 1\n")
    blob, token = pack(str(folder))
    assert pack(str(folder))[1] == token
    out = unpack(blob, tmp_path / "replica" / token)
    assert (out / "MLmodel").read_text() == "flavors: {}\n" and (out / "code" / "x.py").read_bytes() == b"X = 1\n"
    (folder / "MLmodel").write_text("flavors: {sklearn: {}}\n")
    assert pack(str(folder))[1] != token
