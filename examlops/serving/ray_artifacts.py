"""Model artifacts shipped to Ray replicas through Ray itself, never as a path on the ingress's disk.

The ingress fetches a version's MLflow folder as on uvicorn (``ModelSource.fetch``), packs it into one tar
(``pack``), and puts the bytes in the artifact store: a detached named actor (``STORE``, namespace
``examlops``, no CPU) that the driver creates on its own node before Serve starts and kills on shutdown
(``create_store``, ``kill_store``), holding one blob per version key under a token (the blob's digest).
A deployment's ``user_config`` carries only ``{key: token}``; each replica, on any node, asks the store
for the blob (``ShippedLoader``), unpacks it into a folder of its own and loads it with scikit-learn/skops
(``load_sklearn_model``; MLflow is never imported in a replica), then reports its outcome for the version
to the store (``report_outcome``), where the ingress reads whether every replica loaded it.

Failure mode: ``ModelLoadError`` when the store does not hold the key under that token (the ingress
replaced or dropped it, or the store was lost), or the archive is unsafe (a member outside its folder);
whatever the loader raises for the unpacked folder. The store outlives an ingress replica; if it is lost
anyway, the ingress's next call finds (or creates) it again and ships every version it holds again.

Imports ray: only the Ray engine loads this module.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import logging
import tarfile
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import ray
from ray import serve
from ray.exceptions import RayActorError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from examlops.core.errors import ModelLoadError
from examlops.registry.loader import load_sklearn_model
from examlops.serving.ports import Predictor

log = logging.getLogger(__name__)

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
    """The blobs of the versions the ingress holds, by key, and what each replica made of them.

    ``put``, ``get`` (by key and token), ``drop``; ``report(replica, key, token, reason)`` records one
    replica's outcome for a version (``reason`` None: loaded), ``outcomes(key, token)`` reads them. ``put``
    forgets the key's outcomes: a version shipped again is a new attempt, which a failure reported for the
    last one must not refuse before the replicas tried again. ``confirm(key, token)`` marks a version the
    ingress serves (every running replica loaded it), ``confirmed`` asks: a replica started later that
    cannot load a confirmed version is broken (``ray_replica``), while one that fails a version still on
    trial only refuses it. ``put`` and ``drop`` forget the confirmation too. A report for a version the
    store does not hold under that token (dropped, or shipped anew, before a slow replica answered) is
    ignored, so nothing outlives the versions held.
    """

    def __init__(self) -> None:
        self._blobs: dict[str, tuple[str, bytes]] = {}
        self._outcomes: dict[tuple[str, str], dict[str, str | None]] = {}
        self._confirmed: set[tuple[str, str]] = set()

    def put(self, key: str, token: str, blob: bytes) -> None:
        self._blobs[key] = (token, blob)
        self._forget(key)

    def get(self, key: str, token: str) -> bytes | None:
        held = self._blobs.get(key)
        return held[1] if held is not None and held[0] == token else None

    def drop(self, key: str) -> None:
        self._blobs.pop(key, None)
        self._forget(key)

    def confirm(self, key: str, token: str) -> None:
        self._confirmed.add((key, token))

    def confirmed(self, key: str, token: str) -> bool:
        return (key, token) in self._confirmed

    def _forget(self, key: str) -> None:
        for pair in [p for p in self._outcomes if p[0] == key]:
            del self._outcomes[pair]
        self._confirmed = {pair for pair in self._confirmed if pair[0] != key}

    def report(self, replica: str, key: str, token: str, reason: str | None) -> None:
        held = self._blobs.get(key)
        if held is None or held[0] != token:  # a late report of a version dropped or shipped anew: kept nowhere
            return
        self._outcomes.setdefault((key, token), {})[replica] = reason

    def outcomes(self, key: str, token: str) -> dict[str, str | None]:
        return dict(self._outcomes.get((key, token), {}))


def create_store(node: str) -> Any:
    """The store's handle, created if absent: detached (it outlives the ingress replica, so a replacement
    ingress and the replicas keep reaching it), pinned to ``node`` (the driver's). The driver kills it."""
    actor = ray.remote(num_cpus=0)(ArtifactStore)
    handle: Any = actor.options(
        name=STORE,
        namespace=NAMESPACE,
        lifetime="detached",
        get_if_exists=True,
        scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False),
    ).remote()
    ray.get(handle.outcomes.remote("", ""))  # placed and answering
    return handle


def kill_store() -> None:
    """Kill the store, if it runs (the driver's shutdown: a detached actor would outlive it)."""
    with contextlib.suppress(ValueError):  # none runs
        ray.kill(ray.get_actor(STORE, namespace=NAMESPACE))


def store_handle() -> Any:
    """The store's handle from the ingress: the driver's, or one created on this node if it is gone."""
    try:
        return ray.get_actor(STORE, namespace=NAMESPACE)
    except ValueError:
        log.warning("the artifact store is gone: creating it again on this node")
        return create_store(ray.get_runtime_context().get_node_id())


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


async def is_confirmed(key: str, token: str) -> bool:
    """Whether the ingress serves ``key`` as ``token`` (the store's word); False when the store cannot say."""
    try:
        return bool(await ray.get_actor(STORE, namespace=NAMESPACE).confirmed.remote(key, token))
    except Exception as exc:
        log.error("could not ask the artifact store whether %s is confirmed: %s", key, exc)
        return False


async def report_outcome(key: str, token: str, reason: str | None) -> None:
    """A replica tells the store its outcome for one version; logged, never raised (the ingress then waits
    for this replica's word until its deadline)."""
    try:
        replica = serve.get_replica_context().replica_id.unique_id
        await ray.get_actor(STORE, namespace=NAMESPACE).report.remote(replica, key, token, reason)
    except Exception as exc:
        log.error("could not report the outcome of %s to the artifact store: %s", key, exc)


class StoreArtifacts:
    """The ingress's side: ``ship(key, folder)`` packs and stores a version, returning its token; ``drop(key)``;
    ``outcomes(key, token)``, the replicas' reports; ``confirm(key, token)`` once the version serves.

    A store that died or vanished (``RayActorError``, ``ValueError``) is looked up again (or created again)
    and every version shipped so far is shipped (and confirmed) again, from its folder, before the call is
    retried once.
    ``connect`` and ``get`` stand for ``store_handle`` and ``ray.get`` (tests pass fakes).
    """

    def __init__(self, *, connect: Callable[[], Any] = store_handle, get: Callable[[Any], Any] = ray.get) -> None:
        self._connect, self._get = connect, get
        self._store: Any = None
        self._shipped: dict[str, str] = {}  # key -> folder: what a new store must be given again
        self._confirmed: dict[str, str] = {}  # key -> token: what a new store must be told again
        self._lock = threading.Lock()  # one handle, one re-ship, whatever threads call at once

    def ship(self, key: str, folder: str) -> str:
        blob, token = pack(folder)
        self._call(lambda store: store.put.remote(key, token, blob))
        self._shipped[key] = folder
        self._confirmed.pop(key, None)  # the store forgot it too: a new attempt
        return token

    def drop(self, key: str) -> None:
        self._shipped.pop(key, None)
        self._confirmed.pop(key, None)
        self._call(lambda store: store.drop.remote(key))

    def confirm(self, key: str, token: str) -> None:
        self._confirmed[key] = token
        self._call(lambda store: store.confirm.remote(key, token))

    def outcomes(self, key: str, token: str) -> dict[str, str | None]:
        return cast("dict[str, str | None]", self._call(lambda store: store.outcomes.remote(key, token)))

    def _call(self, send: Callable[[Any], Any]) -> Any:
        store = self._handle()
        try:
            return self._get(send(store))
        except (RayActorError, ValueError) as exc:
            log.warning("the artifact store is lost (%s): connecting again and shipping every version", exc)
            return self._get(send(self._renew(store)))

    def _handle(self) -> Any:
        with self._lock:
            if self._store is None:
                self._store = self._connect()
            return self._store

    def _renew(self, dead: Any) -> Any:
        with self._lock:
            if self._store is dead:  # not renewed meanwhile by another thread
                self._store = self._connect()
                for key, folder in list(self._shipped.items()):
                    try:
                        blob, token = pack(folder)
                        self._get(self._store.put.remote(key, token, blob))
                        if self._confirmed.get(key) == token:
                            self._get(self._store.confirm.remote(key, token))
                    except (OSError, RayActorError, ValueError) as exc:  # its replicas report the miss
                        log.error("could not ship %s again: %s", key, exc)
            return self._store
