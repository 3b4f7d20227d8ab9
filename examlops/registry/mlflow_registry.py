"""The MLflow model registry behind the ``ModelSource`` port, plus alias moves.

Contracts (reaching MLflow and translating its errors: ``mlflow_client``):

- Aliases match case-insensitively ("production" is Production). MLflow's are
  case-sensitive, so a requested alias is mapped onto the spelling the model
  already has, else onto the known spelling (``KNOWN_ALIASES``); results are
  keyed by canonical names. Model names match case-insensitively too.
- Every MLflow failure is translated, chained with ``from exc``: a missing
  model, alias or version raises ``ModelNotFound``, ``AliasNotFound`` or
  ``VersionNotFound``; a store that cannot be reached raises
  ``RegistryUnavailable`` (which can take a while: see ``mlflow_client``).
- The client, and with it the ``mlflow`` import, is built on first use:
  constructing this class connects to nothing.
"""

from __future__ import annotations

import shutil
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlparse
from urllib.request import url2pathname

from examlops.core.errors import AliasNotFound, ExamlopsError, ModelLoadError, ModelNotFound, VersionNotFound
from examlops.core.messages import KNOWN_ALIASES, ModelRef, canonical_alias
from examlops.registry.mlflow_client import HttpLimits, connect, import_mlflow, translate_error


@dataclass(frozen=True, slots=True)
class VersionInfo:
    """One registered version as listed: ``aliases`` holds canonical alias names."""

    version: str
    run_id: str | None
    source: str
    aliases: tuple[str, ...]
    created_at: datetime


class MlflowRegistry:
    """Resolve, list, fetch and move aliases of registered models in one MLflow registry.

    ``fetch`` returns the version's artifact folder itself when the store is
    local, else downloads it once into ``cache_dir/<name>/<version>``.
    Safe to share between threads.
    """

    def __init__(self, tracking_uri: str, cache_dir: Path, *, limits: HttpLimits | None = None) -> None:
        self.tracking_uri = tracking_uri
        self.cache_dir = cache_dir
        self.limits = limits
        self._client: Any = None
        self._lock = threading.Lock()

    @property
    def client(self) -> Any:
        """The ``MlflowClient`` for this registry, built on first use (it imports mlflow).

        ``RegistryUnavailable`` when the store cannot be opened, ``ConfigError``
        when MLflow refuses the URI itself.
        """
        with self._lock:
            if self._client is None:
                self._client = connect(self.tracking_uri, self.limits)
            return self._client

    def _call(self, missing: Callable[[], ExamlopsError], fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except ExamlopsError:
            raise
        except Exception as exc:
            raise translate_error(exc, missing) from exc

    def _model(self, name: str) -> Any:
        """The RegisteredModel, matching the name case-insensitively; ``ModelNotFound`` otherwise."""

        def missing() -> ExamlopsError:
            return ModelNotFound(f"model {name!r} is not registered in MLflow")

        try:
            return self.client.get_registered_model(name)
        except ExamlopsError:
            raise
        except Exception as exc:
            if getattr(exc, "error_code", None) != "RESOURCE_DOES_NOT_EXIST":
                raise translate_error(exc, missing) from exc
            for other in self.list_models():
                if other.lower() == name.lower() and other != name:
                    return self._call(missing, self.client.get_registered_model, other)
            raise missing() from exc

    def _ref(self, name: str, version: str) -> ModelRef:
        def missing() -> ExamlopsError:
            return VersionNotFound(f"model {name!r} has no version {version!r}")

        if not version.isdigit():
            raise missing()
        mv = self._call(missing, self.client.get_model_version, name, version)
        return ModelRef(name=name, version=str(mv.version), run_id=mv.run_id or None, source=str(mv.source))

    def aliases(self, name: str) -> dict[str, ModelRef]:
        """Every alias of the model, keyed by canonical name; empty when it has none."""
        model = self._model(name)
        refs: dict[str, ModelRef] = {}
        for raw, version in dict(model.aliases).items():
            refs[canonical_alias(raw)] = self._ref(model.name, str(version))
        return refs

    def resolve(self, name: str, alias: str) -> ModelRef:
        """The version ``alias`` points at now; ``AliasNotFound`` when the model lacks it."""
        model = self._model(name)
        existing = dict(model.aliases)
        raw = canonical_alias(alias, list(existing))
        if raw not in existing:
            known = ", ".join(sorted(existing)) or "none"
            raise AliasNotFound(f"model {model.name!r} has no alias {alias!r} (aliases: {known})")
        return self._ref(model.name, str(existing[raw]))

    def version(self, name: str, version: str) -> ModelRef:
        """One raw version; ``VersionNotFound`` when it does not exist."""
        return self._ref(self._model(name).name, version)

    def set_alias(self, name: str, alias: str, version: str) -> ModelRef | None:
        """Point ``alias`` at ``version``; return what it pointed at before, or None if it is new.

        An alias the model already has keeps its MLflow spelling; a new one
        gets the canonical spelling ("canary" -> "Canary").
        """
        model = self._model(name)
        existing = dict(model.aliases)
        raw = canonical_alias(alias, [*existing, *KNOWN_ALIASES])
        target = self._ref(model.name, version)
        previous = self._ref(model.name, str(existing[raw])) if raw in existing else None

        def missing() -> ExamlopsError:
            return VersionNotFound(f"model {model.name!r} has no version {version!r}")

        self._call(missing, self.client.set_registered_model_alias, model.name, raw, target.version)
        return previous

    def delete_alias(self, name: str, alias: str) -> None:
        """Remove ``alias``; ``AliasNotFound`` when the model lacks it (MLflow itself says nothing)."""
        model = self._model(name)
        existing = dict(model.aliases)
        raw = canonical_alias(alias, list(existing))
        if raw not in existing:
            raise AliasNotFound(f"model {model.name!r} has no alias {alias!r}")

        def missing() -> ExamlopsError:
            return AliasNotFound(f"model {model.name!r} has no alias {alias!r}")

        self._call(missing, self.client.delete_registered_model_alias, model.name, raw)

    def model_tags(self, name: str) -> dict[str, str]:
        """The registered model's tags (empty when it has none)."""
        return {str(k): str(v) for k, v in dict(self._model(name).tags or {}).items()}

    def set_model_tag(self, name: str, key: str, value: str) -> None:
        """Set one tag on the registered model (visible in the MLflow UI)."""
        model = self._model(name)

        def missing() -> ExamlopsError:
            return ModelNotFound(f"model {name!r} is not registered in MLflow")

        self._call(missing, self.client.set_registered_model_tag, model.name, key, value)

    def list_versions(self, name: str) -> list[VersionInfo]:
        """Every version of the model, oldest first."""
        model = self._model(name)
        # search_model_versions leaves ModelVersion.aliases empty (in the locked MLflow): invert the model's map.
        by_version: dict[str, list[str]] = {}
        for raw, version in dict(model.aliases).items():
            by_version.setdefault(str(version), []).append(canonical_alias(raw))
        quote = '"' if "'" in model.name else "'"
        versions = self._paged(
            lambda: ModelNotFound(f"model {name!r} is not registered in MLflow"),
            self.client.search_model_versions,
            f"name = {quote}{model.name}{quote}",
        )
        infos = [
            VersionInfo(
                version=str(mv.version),
                run_id=mv.run_id or None,
                source=str(mv.source),
                aliases=tuple(sorted(by_version.get(str(mv.version), []))),
                created_at=datetime.fromtimestamp((mv.creation_timestamp or 0) / 1000, tz=UTC),
            )
            for mv in versions
        ]
        return sorted(infos, key=lambda info: int(info.version))

    def list_models(self) -> list[str]:
        """Names of every registered model, sorted."""
        models = self._paged(lambda: ModelNotFound("no registered models"), self.client.search_registered_models)
        return sorted(str(m.name) for m in models)

    def _paged(self, missing: Callable[[], ExamlopsError], search: Callable[..., Any], *args: Any) -> list[Any]:
        items: list[Any] = []
        token: str | None = None
        while True:
            page = self._call(missing, search, *args, page_token=token)
            items.extend(page)
            token = page.token
            if not token:
                return items

    def fetch(self, ref: ModelRef) -> str:
        """A local folder holding the version's MLflow model (the folder with ``MLmodel``).

        A local store's folder is returned as is; anything else is downloaded
        once into ``cache_dir/<name>/<version>`` (atomically: a half-finished
        download is never returned). ``VersionNotFound`` when the version is
        gone, ``ModelLoadError`` when a local store lost its folder,
        ``RegistryUnavailable`` when the store cannot be reached.
        """

        def missing() -> ExamlopsError:
            return VersionNotFound(f"model {ref.name!r} has no version {ref.version!r} to fetch")

        uri = str(self._call(missing, self.client.get_model_version_download_uri, ref.name, ref.version))
        local = local_artifact_path(uri)
        if local is not None:
            if not local.is_dir():
                raise ModelLoadError(f"the artifact folder of {ref.name} version {ref.version} is missing: {local}")
            return str(local)
        target = self.cache_dir / ref.name / ref.version
        if target.is_dir():
            return str(target)
        target.parent.mkdir(parents=True, exist_ok=True)
        mlflow = import_mlflow()
        with tempfile.TemporaryDirectory(dir=target.parent, prefix=f".{ref.version}-") as tmp:
            downloaded = self._call(
                missing, mlflow.artifacts.download_artifacts, uri, dst_path=tmp, tracking_uri=self.tracking_uri
            )
            try:
                Path(downloaded).rename(target)
            except OSError:
                if not target.is_dir():  # another thread or process won the race: use its copy
                    raise
                shutil.rmtree(downloaded, ignore_errors=True)
        return str(target)


def local_artifact_path(uri: str) -> Path | None:
    """The local file path an artifact URI names (existing or not), or None when it is remote."""
    parsed = urlparse(uri)
    if parsed.scheme == "file" and parsed.netloc in ("", "localhost"):
        return Path(url2pathname(parsed.path))
    if parsed.scheme == "":
        return Path(uri)
    return None
