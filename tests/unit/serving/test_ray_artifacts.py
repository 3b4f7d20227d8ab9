"""The ingress's side of the artifact store against fake store handles: a store that dies is replaced and refilled."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("ray", reason="the Ray engine needs the ray extra (pip install 'examlops[ray]')")

from ray.exceptions import RayActorError

from examlops.serving.ray_artifacts import ArtifactStore, StoreArtifacts


class Call:
    def __init__(self, handle: FakeHandle, name: str) -> None:
        self._handle, self._name = handle, name

    def remote(self, *args: Any) -> Callable[[], Any]:
        def reply() -> Any:  # what ``ray.get`` of the call's reference gives
            if self._handle.dead:
                raise RayActorError()
            return getattr(self._handle.store, self._name)(*args)

        return reply


class FakeHandle:
    """A handle to an ``ArtifactStore`` actor, which dies when the test says so."""

    def __init__(self) -> None:
        self.store, self.dead = ArtifactStore(), False

    def __getattr__(self, name: str) -> Call:
        return Call(self, name)


def model(folder: Path, text: str) -> str:
    folder.mkdir()
    (folder / "MLmodel").write_text(text)
    return str(folder)


def test_a_store_that_died_is_connected_again_and_given_every_shipped_version_again(tmp_path: Path) -> None:
    handles: list[FakeHandle] = []

    def connect() -> FakeHandle:
        handles.append(FakeHandle())
        return handles[-1]

    artifacts = StoreArtifacts(connect=connect, get=lambda reply: reply())
    one = artifacts.ship("M/1", model(tmp_path / "1", "one"))
    two = artifacts.ship("M/2", model(tmp_path / "2", "two"))
    artifacts.drop("M/2")
    handles[0].dead = True  # the actor died: its handle's calls raise from now on

    three = artifacts.ship("M/3", model(tmp_path / "3", "three"))
    assert len(handles) == 2
    fresh = handles[1].store
    assert fresh.get("M/1", one) is not None and fresh.get("M/3", three) is not None
    assert fresh.get("M/2", two) is None  # dropped before: not shipped again
    fresh.report("r1", "M/3", three, None)
    assert artifacts.outcomes("M/3", three) == {"r1": None}
    assert len(handles) == 2  # the live handle is kept


def test_a_store_that_cannot_be_found_is_looked_up_again(tmp_path: Path) -> None:
    calls = {"n": 0}

    def get(reply: Callable[[], Any]) -> Any:
        calls["n"] += 1
        if calls["n"] == 1:
            raise ValueError("Failed to look up actor examlops-artifacts")
        return reply()

    handles: list[FakeHandle] = []
    artifacts = StoreArtifacts(connect=lambda: handles.append(FakeHandle()) or handles[-1], get=get)
    token = artifacts.ship("M/1", model(tmp_path / "1", "one"))
    assert len(handles) == 2 and handles[1].store.get("M/1", token) is not None


def test_a_version_shipped_again_forgets_the_failures_reported_for_the_last_attempt(tmp_path: Path) -> None:
    handle = FakeHandle()
    artifacts = StoreArtifacts(connect=lambda: handle, get=lambda reply: reply())
    folder = model(tmp_path / "1", "one")
    token = artifacts.ship("M/1", folder)
    handle.store.report("r1", "M/1", token, "OSError: the node was busy")
    assert artifacts.ship("M/1", folder) == token  # the same bytes: the same token, a new attempt
    assert artifacts.outcomes("M/1", token) == {}


def test_a_confirmed_version_is_told_to_a_new_store_and_forgotten_when_shipped_again_or_dropped(
    tmp_path: Path,
) -> None:
    handles: list[FakeHandle] = []

    def connect() -> FakeHandle:
        handles.append(FakeHandle())
        return handles[-1]

    artifacts = StoreArtifacts(connect=connect, get=lambda reply: reply())
    one = artifacts.ship("M/1", model(tmp_path / "1", "one"))
    artifacts.confirm("M/1", one)
    two = artifacts.ship("M/2", model(tmp_path / "2", "two"))
    assert handles[0].store.confirmed("M/1", one) and not handles[0].store.confirmed("M/2", two)
    handles[0].dead = True

    artifacts.drop("M/2")  # reaches a new store, which is told M/1 is confirmed
    assert handles[1].store.confirmed("M/1", one)
    artifacts.ship("M/1", str(tmp_path / "1"))  # shipped again: on trial again
    assert not handles[1].store.confirmed("M/1", one)


def test_a_report_that_comes_after_its_version_was_dropped_is_not_kept() -> None:
    store = ArtifactStore()
    store.put("M/1", "t1", b"blob")
    store.report("r1", "M/1", "t1", None)
    store.drop("M/1")
    store.report("r2", "M/1", "t1", "ValueError: late")  # a slow replica, after the ingress gave up
    store.report("r2", "M/9", "t9", None)  # never shipped at all
    assert store.outcomes("M/1", "t1") == {} and store.outcomes("M/9", "t9") == {}
    assert store._outcomes == {}
