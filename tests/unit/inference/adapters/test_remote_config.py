"""A remote adapter's wiring is checked when it is built: a typo or a missing key is inference_wiring_invalid."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import pytest

from examlops.inference.adapters.examlops import examlops_adapter
from examlops.inference.adapters.kserve_v2 import EXAMLOPS_V2, V2Target, kserve_v2_adapter
from examlops.inference.adapters.mlflow import MlflowTarget, mlflow_adapter
from examlops.inference.errors import InferenceError, Kind

Factory = Callable[[Mapping[str, Any], Mapping[str, Any]], object]
URL = {"url": "http://s"}


@pytest.mark.parametrize(
    ("factory", "route", "settings"),
    [
        (mlflow_adapter, {"fromat": "dataframe"}, URL),  # once silently ignored
        (mlflow_adapter, {"format": "csv"}, URL),
        (mlflow_adapter, {"columns": ["a"]}, URL),  # columns need the dataframe format
        (mlflow_adapter, {}, {**URL, "max_batch": "lots"}),
        (kserve_v2_adapter, {}, URL),  # no model
        (kserve_v2_adapter, {"model": "m", "input": "examlops"}, URL),
        (kserve_v2_adapter, {"model": "m", "inputs": [{"name": "x", "feilds": ["a"]}]}, URL),
        (kserve_v2_adapter, {"model": "m"}, {}),  # no url
        (kserve_v2_adapter, {"model": "m"}, {**URL, "tokn": "k"}),
        (examlops_adapter, {"tsk": "t"}, URL),
        (examlops_adapter, {"task": "t", "alias": "P"}, URL),  # a task takes no alias
        (examlops_adapter, {"task": "t"}, {"uri": "http://s"}),
    ],
)
def test_a_bad_remote_wiring_is_inference_wiring_invalid(
    factory: Factory, route: dict[str, Any], settings: dict[str, Any]
) -> None:
    with pytest.raises(InferenceError) as caught:
        factory({"score": route}, settings)
    assert (caught.value.kind, caught.value.code) == (Kind.VALIDATION, "inference_wiring_invalid")


def test_a_good_remote_wiring_still_builds() -> None:
    mlflow = mlflow_adapter({"score": {"format": "dataframe", "columns": ["a", "b"]}}, {**URL, "max_batch": 8})
    assert mlflow.capabilities.max_batch == 8
    kserve = kserve_v2_adapter({"score": {"model": "m", "version": 3, "inputs": "examlops"}}, URL)
    assert kserve.capabilities.max_batch is None
    examlops = examlops_adapter({"score": {"model": "m", "version": 2, "reply_fields": ["model"]}}, URL)
    assert examlops.capabilities.max_batch == 64
    assert MlflowTarget.of({"format": "dataframe", "columns": ["a"]}).columns == ("a",)
    target = V2Target.of({"model": "m", "version": 3, "inputs": "examlops"})
    assert (target.version, target.inputs) == ("3", EXAMLOPS_V2)
