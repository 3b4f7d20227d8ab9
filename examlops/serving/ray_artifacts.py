"""Model artifacts shipped to Ray replicas through Ray itself, never as a path on the ingress's disk.

The ingress fetches a version's MLflow folder as on uvicorn (``ModelSource.fetch``), packs it into one tar
(``pack``), and puts the bytes in the artifact store: a named actor (``STORE``, namespace ``examlops``, no
CPU) pinned to the ingress's node, holding one blob per version key under a token (the blob's digest).
A deployment's ``user_config`` carries only ``{key: token}``; each replica, on any node, asks the store
for the blob (``load_shipped``), unpacks it into a folder of its own and loads it with scikit-learn/skops
(``load_sklearn_model``; MLflow is never imported in a replica).

Failure mode: ``ModelLoadError`` when the store does not hold the key under that token (the ingress
replaced or dropped it, or the store died with the ingress), or the archive is unsafe (a member outside
its folder); whatever the loader raises for the unpacked folder. The store lives as long as the ingress
replica that created it: a new ingress loads its hot set again, and so refills it.

Imports ray: only the Ray engine loads this module.
"""

from __future__ import annotations

import hashlib
import io
import tarfile
import tempfile
import threading
from pathlib import Path
from typing import Any, cast

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from examlops.core.errors import ModelLoadError
from examlops.registry.loader import load_sklearn_model
from examlops.serving.ports import Predictor

STORE = "examlops-artifacts"
NAMESPACE = "examlops"


def pack(folder: str) -> tuple[bytes, str]:
    """The folder's files as one tar, and its token (a digest: the same files give the same token)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for path in sorted(Path(folder).rglob("*")):
            info = tar.gettarinfo(str(path), arcname=str(path.relative_to(folder)))
            info.mtime = 0  # the token depends on the content only
            if path.is_file():
                with path.open("rb") as handle:
                    tar.addfile(info, handle)
            elif path.is_dir():
                tar.addfile(info)
    blob = buffer.getvalue()
    return blob, hashlib.sha256(blob).hexdigest()[:20]


def unpack(blob: bytes, into: Path) -> Path:
    """Extract ``blob`` into the folder ``into`` (created); refuses members that leave it."""
    into.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(blob), mode="r") as tar:
        try:
            tar.extractall(into, filter="data")
        except tarfile.FilterError as exc:
            raise ModelLoadError(f"the shipped artifact is unsafe to unpack: {exc}") from exc
    return into


class ArtifactStore:
    """The blobs of the versions the ingress holds, by key: ``put``, ``get`` (by key and token), ``drop``."""

    def __init__(self) -> None:
        self._blobs: dict[str, tuple[str, bytes]] = {}

    def put(self, key: str, token: str, blob: bytes) -> None:
        self._blobs[key] = (token, blob)

    def get(self, key: str, token: str) -> bytes | None:
        held = self._blobs.get(key)
        return held[1] if held is not None and held[0] == token else None

    def drop(self, key: str) -> None:
        self._blobs.pop(key, None)


def artifact_store() -> Any:
    """The store's handle from the ingress: created on first use, pinned to the calling process's node."""
    node = ray.get_runtime_context().get_node_id()
    actor = ray.remote(num_cpus=0)(ArtifactStore)
    return actor.options(
        name=STORE,
        namespace=NAMESPACE,
        get_if_exists=True,
        scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False),
    ).remote()


class ShippedLoader:
    """A replica's loader: ``(key, token)`` -> the model, fetched from the store and unpacked locally."""

    def __init__(self) -> None:
        self._folder: tempfile.TemporaryDirectory[str] | None = None

    def __call__(self, key: str, token: str) -> Predictor:
        store = ray.get_actor(STORE, namespace=NAMESPACE)
        blob = cast("bytes | None", ray.get(store.get.remote(key, token)))
        if blob is None:
            raise ModelLoadError(f"the artifact store does not hold {key} as {token}")
        if self._folder is None:  # removed when the replica's process ends
            self._folder = tempfile.TemporaryDirectory(prefix="examlops-replica-")
        target = Path(self._folder.name) / key.replace("/", "-") / token
        if not (target / "MLmodel").is_file():
            unpack(blob, target)
        return load_sklearn_model(str(target))


class StoreArtifacts:
    """The ingress's side: ``ship(key, folder)`` packs and stores a version, returning its token; ``drop(key)``."""

    def __init__(self) -> None:
        self._store: Any = None
        self._lock = threading.Lock()  # handles made at once in several threads lose the named actor

    def ship(self, key: str, folder: str) -> str:
        blob, token = pack(folder)
        ray.get(self._handle().put.remote(key, token, blob))
        return token

    def drop(self, key: str) -> None:
        ray.get(self._handle().drop.remote(key))

    def _handle(self) -> Any:
        with self._lock:
            if self._store is None:
                self._store = artifact_store()
            return self._store
