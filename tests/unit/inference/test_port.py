"""The port's contract over the mock: order, all or nothing, shaping, refusals before I/O, capture."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence

import pytest

from examlops.inference import Capture, FeatureUnsupported, InferenceError, InferencePort, Kind
from examlops.inference.adapters.mock import MockInferenceRegistry
from examlops.inference.ports import Call, Capabilities, Row
from tests.unit.inference.fakes import (
    FRAUD,
    FRAUD_VERBATIM,
    FraudScore,
    RecordingAdapter,
    features,
    scoring_registry,
)


async def test_predict_returns_the_output_model() -> None:
    port = InferencePort(FRAUD, scoring_registry())
    assert await port.predict(features(120.0)) == FraudScore(risk=0.12)


async def test_predict_many_keeps_order_across_the_backend_batch_cap() -> None:
    registry = scoring_registry(max_batch=3)
    port = InferencePort(FRAUD, registry)
    scores = await port.predict_many([features(float(a)) for a in range(10)])
    assert [s.risk for s in scores] == [a / 1000 for a in range(10)]
    assert [len(rows) for _, rows in registry.calls] == [3, 3, 3, 1]


async def test_a_mapping_is_validated_into_the_input_model() -> None:
    registry = scoring_registry()
    port = InferencePort(FRAUD, registry)
    assert await port.predict({"amount": "500", "country": "NL", "velocity_24h": 2}) == FraudScore(risk=0.5)
    assert registry.calls[0][1] == ({"amount": 500.0, "country": "NL", "velocity_24h": 2},)


@pytest.mark.parametrize("bad", [{"amount": "lots", "country": "NL", "velocity_24h": 1}, 42, FraudScore(risk=1)])
async def test_a_bad_instance_fails_the_batch_before_any_call(bad: object) -> None:
    registry = scoring_registry()
    port = InferencePort(FRAUD, registry)
    with pytest.raises(InferenceError) as caught:
        await port.predict_many([features(1.0), bad])  # type: ignore[list-item]  # the wrong type on purpose
    assert (caught.value.kind, caught.value.code) == (Kind.VALIDATION, "inference_input_invalid")
    assert "instance 1" in caught.value.message and "lots" not in str(caught.value)
    assert registry.calls == []


async def test_one_failed_backend_call_fails_the_whole_batch() -> None:
    def score(instances: list[object]) -> list[dict[str, float]]:
        if any(getattr(i, "amount", 0) < 0 for i in instances):
            raise ValueError("negative amount")
        return [{"risk": 0.0} for _ in instances]

    registry = MockInferenceRegistry(max_batch=2).on("fraud_scorer", score)
    port = InferencePort(FRAUD, registry)
    with pytest.raises(InferenceError) as caught:
        await port.predict_many([features(1.0), features(2.0), features(-1.0)])
    assert (caught.value.kind, caught.value.code) == (Kind.MODEL_FAILURE, "mock.inference.failed")


async def test_an_unprogrammed_route_fails_closed() -> None:
    port = InferencePort(FRAUD, MockInferenceRegistry())
    with pytest.raises(InferenceError) as caught:
        await port.predict(features(1.0))
    assert (caught.value.kind, caught.value.code) == (Kind.PRECONDITION, "mock.inference.unprogrammed")


@pytest.mark.parametrize(
    ("answer", "what"),
    [
        (lambda rows: [{"score": 1.0} for _ in rows], "does not match FraudScore"),
        (lambda rows: [{"risk": "high"} for _ in rows], "does not match FraudScore"),
        (lambda rows: [{"risk": 0.1}], "returned 1 outputs for 2 instances"),
        (lambda rows: [0.1 for _ in rows], "not a mapping"),
        (lambda rows: {"risk": 0.1}, "not a list of outputs"),
    ],
)
async def test_a_mis_shaped_output_fails_the_batch_naming_backend_and_route(answer: object, what: str) -> None:
    port = InferencePort(FRAUD, MockInferenceRegistry().on("fraud_scorer", answer))  # type: ignore[arg-type]
    with pytest.raises(InferenceError) as caught:
        await port.predict_many([features(1.0), features(2.0)])
    error = caught.value
    assert (error.kind, error.code, error.backend, error.route) == (
        Kind.VALIDATION,
        "inference_output_invalid",
        "mock",
        "fraud_scorer",
    )
    assert what in error.message


async def test_an_empty_batch_makes_no_call() -> None:
    registry = scoring_registry()
    assert await InferencePort(FRAUD, registry).predict_many([]) == []
    assert registry.calls == []


async def test_streaming_from_a_backend_without_it_is_refused_before_any_io() -> None:
    adapter = RecordingAdapter(scoring_registry())
    port = InferencePort(FRAUD, adapter)
    with pytest.raises(FeatureUnsupported) as caught:
        port.predict_stream([features(1.0)])
    assert (caught.value.code, caught.value.feature, caught.value.backend) == (
        "inference_feature_unsupported",
        "streaming",
        "recording",
    )
    assert adapter.calls == [] and adapter.inner.calls == []


@pytest.mark.parametrize(
    ("options", "feature"),
    [({"offline": True}, "offline jobs"), ({"model_version": "3"}, "the option 'model_version'")],
)
async def test_an_option_the_backend_lacks_is_refused_before_any_io(options: dict[str, object], feature: str) -> None:
    adapter = RecordingAdapter(scoring_registry())
    with pytest.raises(FeatureUnsupported) as caught:
        await InferencePort(FRAUD, adapter).predict(features(1.0), options=options)
    assert caught.value.feature == feature and caught.value.kind is Kind.PRECONDITION
    assert adapter.calls == []


async def test_determinism_is_refused_from_a_backend_that_does_not_promise_it() -> None:
    from examlops.inference import Capabilities

    adapter = RecordingAdapter(scoring_registry(), Capabilities(native_batching=True))
    with pytest.raises(FeatureUnsupported):
        await InferencePort(FRAUD, adapter).predict(features(1.0), options={"deterministic": True})
    assert await InferencePort(FRAUD, scoring_registry()).predict(features(1.0), options={"deterministic": True})


async def test_captures_redact_every_input_field_unless_the_spec_opts_in() -> None:
    captured: list[Capture] = []
    await InferencePort(FRAUD, scoring_registry(), on_capture=captured.append).predict(features(100.0, "FR", 7))
    await InferencePort(FRAUD_VERBATIM, scoring_registry(), on_capture=captured.append).predict(features(100.0))
    redacted, verbatim = captured
    assert redacted.inputs == ({"amount": "<redacted>", "country": "<redacted>", "velocity_24h": "<redacted>"},)
    assert redacted.outputs == ({"risk": 0.1},) and redacted.error is None
    assert (redacted.route, redacted.backend) == ("fraud_scorer", "mock")
    assert verbatim.inputs == ({"amount": 100.0, "country": "NL", "velocity_24h": 1},)


async def test_a_failed_call_is_captured_with_its_error_and_redacted_inputs() -> None:
    captured: list[Capture] = []
    port = InferencePort(FRAUD, MockInferenceRegistry(), on_capture=captured.append)
    with pytest.raises(InferenceError):
        await port.predict(features(5.0))
    (capture,) = captured
    assert capture.outputs is None and capture.error is not None
    assert capture.error.code == "mock.inference.unprogrammed"
    assert set(capture.inputs[0].values()) == {"<redacted>"}


async def test_a_capture_hook_that_raises_does_not_fail_the_prediction(caplog: pytest.LogCaptureFixture) -> None:
    def broken(_: Capture) -> None:
        raise RuntimeError("disk full")

    assert await InferencePort(FRAUD, scoring_registry(), on_capture=broken).predict(features(1.0))
    assert "capture hook failed" in caplog.text


async def test_an_adapter_exception_outside_the_taxonomy_becomes_infrastructure() -> None:
    class Broken(RecordingAdapter):
        async def predict_batch(self, route: str, rows: Sequence[Row], call: Call) -> Sequence[Row]:
            raise ConnectionResetError("peer went away")

    with pytest.raises(InferenceError) as caught:
        await InferencePort(FRAUD, Broken(scoring_registry())).predict(features(1.0))
    assert (caught.value.kind, caught.value.code, caught.value.retryable) == (
        Kind.INFRASTRUCTURE,
        "inference_adapter_error",
        True,
    )
    assert isinstance(caught.value.__cause__, ConnectionResetError)


async def test_a_backend_without_native_batching_gets_one_instance_per_call_in_order() -> None:
    from examlops.inference import Capabilities

    adapter = RecordingAdapter(scoring_registry(), Capabilities())
    scores = await InferencePort(FRAUD, adapter).predict_many([features(float(a)) for a in range(4)])
    assert [s.risk for s in scores] == [0.0, 0.001, 0.002, 0.003]
    assert [len(rows) for _, rows in adapter.inner.calls] == [1, 1, 1, 1]


class _CappedStreamer:
    """A streaming backend that refuses a stream of more than ``max_batch`` rows, like the examlops adapter."""

    backend = "capped"

    def __init__(self, max_batch: int, *, answer: int | None = None) -> None:
        self.capabilities = Capabilities(native_batching=True, max_batch=max_batch, streaming=True)
        self.streamed: list[int] = []
        self.answer = answer

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        return None

    async def predict_batch(self, route: str, rows: Sequence[Row], call: Call) -> Sequence[Row]:
        raise AssertionError("a stream goes through stream_batches")

    async def stream_batches(self, route: str, rows: Sequence[Row], call: Call) -> AsyncIterator[Sequence[Row]]:
        cap = self.capabilities.max_batch or len(rows)
        if len(rows) > cap:
            raise FeatureUnsupported(f"more than {cap} instances", backend=self.backend, route=route)
        self.streamed.append(len(rows))
        outputs = [{"risk": row["amount"] / 1000} for row in rows][: self.answer]
        for start in range(0, len(outputs), 10):
            yield outputs[start : start + 10]


async def test_a_native_stream_longer_than_the_backend_cap_is_sent_in_windows_of_the_cap() -> None:
    backend = _CappedStreamer(64)
    port = InferencePort(FRAUD, backend)
    chunks = [chunk async for chunk in port.predict_stream([features(float(a)) for a in range(150)], chunk_size=50)]
    assert [len(chunk) for chunk in chunks] == [50, 50, 50]
    assert [s.risk for chunk in chunks for s in chunk] == [a / 1000 for a in range(150)]
    assert backend.streamed == [64, 64, 22]


async def test_a_window_answered_short_fails_the_stream_rather_than_shift_outputs() -> None:
    port = InferencePort(FRAUD, _CappedStreamer(64, answer=63))
    with pytest.raises(InferenceError) as raised:
        _ = [chunk async for chunk in port.predict_stream([features(float(a)) for a in range(100)])]
    assert raised.value.code == "inference_output_invalid"
