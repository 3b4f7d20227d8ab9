"""The local adapter: warm start fails closed, per-route serialisation, deadlines on a bounded thread pool."""

from __future__ import annotations

import asyncio
import threading

import pytest

from examlops.inference import InferenceError, InferencePort, Kind
from examlops.inference.adapters.local import LocalInferenceAdapter, LocalTarget
from tests.unit.inference.fakes import FRAUD, FraudScore, features
from tests.unit.inference.models import Doubler, load_nothing


async def test_a_loader_error_fails_start_closed() -> None:
    adapter = LocalInferenceAdapter({"fraud_scorer": LocalTarget(load_nothing)})
    with pytest.raises(InferenceError) as caught:
        await adapter.start()
    assert (caught.value.kind, caught.value.code, caught.value.route) == (
        Kind.PRECONDITION,
        "inference_model_load_failed",
        "fraud_scorer",
    )
    assert isinstance(caught.value.__cause__, FileNotFoundError)
    with pytest.raises(InferenceError) as after:
        await InferencePort(FRAUD, adapter).predict(features(1.0))
    assert after.value.code == "inference_not_started"


async def test_warm_start_loads_once_before_the_first_call() -> None:
    loads: list[Doubler] = []

    def loader() -> Doubler:
        loads.append(Doubler())
        return loads[-1]

    adapter = LocalInferenceAdapter({"fraud_scorer": LocalTarget(loader)})
    await adapter.start()
    try:
        assert len(loads) == 1
        port = InferencePort(FRAUD, adapter)
        assert await port.predict_many([features(100.0), features(300.0)]) == [
            FraudScore(risk=0.1),
            FraudScore(risk=0.3),
        ]
        assert len(loads) == 1 and loads[0].calls == 1
    finally:
        await adapter.close()


async def test_a_lazy_model_loads_on_first_call_and_a_failed_load_is_retried() -> None:
    attempts: list[int] = []

    def flaky() -> Doubler:
        attempts.append(1)
        if len(attempts) == 1:
            raise OSError("store not reachable yet")
        return Doubler()

    adapter = LocalInferenceAdapter({"fraud_scorer": LocalTarget(flaky, warm_on_startup=False)})
    await adapter.start()
    try:
        assert attempts == []
        port = InferencePort(FRAUD, adapter)
        with pytest.raises(InferenceError) as caught:
            await port.predict(features(1.0))
        assert caught.value.code == "inference_model_load_failed"
        assert await port.predict(features(500.0)) == FraudScore(risk=0.5)
        assert len(attempts) == 2
    finally:
        await adapter.close()


@pytest.mark.parametrize("serialize", [True, False])
async def test_serialize_calls_runs_one_prediction_at_a_time_per_route(serialize: bool) -> None:
    model = Doubler()
    adapter = LocalInferenceAdapter({"fraud_scorer": LocalTarget(lambda: model, serialize_calls=serialize)}, workers=4)
    await adapter.start()
    try:
        port = InferencePort(FRAUD, adapter)
        results = await asyncio.gather(*(port.predict(features(float(a))) for a in range(16)))
        assert [r.risk for r in results] == [a / 1000 for a in range(16)]
        assert model.calls == 16
        if serialize:
            assert model.most_at_once == 1
    finally:
        await adapter.close()


async def test_a_slow_prediction_times_out_by_the_deadline_and_frees_the_caller() -> None:
    gate = threading.Event()
    model = Doubler(gate)
    adapter = LocalInferenceAdapter({"fraud_scorer": LocalTarget(lambda: model)}, workers=1)
    await adapter.start()
    try:
        port = InferencePort(FRAUD, adapter)
        with pytest.raises(InferenceError) as caught:
            await port.predict(features(1.0), options={"timeout": 0.05})
        assert (caught.value.kind, caught.value.backend) == (Kind.TIMEOUT, "local")
        assert model.entered.is_set()  # it was running: its thread keeps it until it ends
        # The only worker is still busy: a second call queues, times out, and is dropped from the queue.
        with pytest.raises(InferenceError):
            await port.predict(features(2.0), options={"timeout": 0.05})
        gate.set()
        assert await port.predict(features(3.0), options={"timeout": 10}) == FraudScore(risk=0.003)
        assert model.calls == 2  # the stuck one and the last; the queued one never ran
    finally:
        gate.set()
        await adapter.close()


async def test_a_model_that_raises_is_a_model_failure() -> None:
    class Broken:
        def predict_batch(self, instances: object) -> object:
            raise ValueError("shapes (1,3) and (4,) not aligned")

    adapter = LocalInferenceAdapter({"fraud_scorer": LocalTarget(Broken)})
    await adapter.start()
    try:
        with pytest.raises(InferenceError) as caught:
            await InferencePort(FRAUD, adapter).predict(features(1.0))
        assert (caught.value.kind, caught.value.code) == (Kind.MODEL_FAILURE, "inference_model_failed")
    finally:
        await adapter.close()


async def test_a_loader_returning_no_predict_batch_fails_start() -> None:
    adapter = LocalInferenceAdapter({"fraud_scorer": LocalTarget(lambda: object())})  # type: ignore[arg-type,return-value]
    with pytest.raises(InferenceError) as caught:
        await adapter.start()
    assert "no predict_batch" in caught.value.message


async def test_a_serialized_route_never_runs_two_predictions_even_after_a_timeout() -> None:
    gate = threading.Event()
    model = Doubler(gate)
    adapter = LocalInferenceAdapter({"fraud_scorer": LocalTarget(lambda: model, serialize_calls=True)}, workers=2)
    await adapter.start()
    try:
        port = InferencePort(FRAUD, adapter)
        with pytest.raises(InferenceError):
            await port.predict(features(1.0), options={"timeout": 0.05})  # still running on its worker
        second = asyncio.create_task(port.predict(features(2.0), options={"timeout": 30}))
        await asyncio.sleep(0.05)
        assert not second.done() and model.calls == 1  # waiting for the stale one to end
        gate.set()
        assert await second == FraudScore(risk=0.002)
        assert model.most_at_once == 1
    finally:
        gate.set()
        await adapter.close()


async def test_a_serialized_call_that_timed_out_waiting_for_the_route_never_runs_the_model() -> None:
    gate = threading.Event()
    model = Doubler(gate)
    adapter = LocalInferenceAdapter({"fraud_scorer": LocalTarget(lambda: model, serialize_calls=True)}, workers=4)
    await adapter.start()
    try:
        port = InferencePort(FRAUD, adapter)
        first = asyncio.create_task(port.predict(features(1.0)))
        await asyncio.to_thread(model.entered.wait, 30)
        first.cancel()  # the caller gives up; its prediction runs on and keeps the route's thread lock
        with pytest.raises(asyncio.CancelledError):
            await first
        for amount in (2.0, 3.0):  # each waits on a worker for the stale call's thread lock, then gives up
            with pytest.raises(InferenceError) as caught:
                await port.predict(features(amount), options={"timeout": 0.05})
            assert caught.value.kind is Kind.TIMEOUT
        last = asyncio.create_task(port.predict(features(4.0), options={"timeout": 30}))
        gate.set()
        assert await last == FraudScore(risk=0.004)
        pool = adapter._executor
        assert pool is not None
        await asyncio.to_thread(pool.shutdown, True)  # every worker done, the timed-out ones included
        assert model.calls == 2  # the first call and the last: never the two that timed out waiting
    finally:
        gate.set()
        await adapter.close()
