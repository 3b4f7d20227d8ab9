"""Where each effective setting came from, for ``exa config show``.

``setting_sources`` yields every leaf setting with its effective value and its
source: ``env EXAMLOPS_...`` when that variable is set, else ``default``. A
location left unset (the catalog, the database, MLflow, Redis, Prefect) shows
the value the platform derives for it, with the source saying so, never
``None``. Secrets are masked.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from pydantic import BaseModel, SecretStr

from examlops.core.settings import ENV_PREFIX, NESTED_DELIMITER, Settings

MASK = "**********"

DERIVED: Mapping[str, tuple[Callable[[Settings], str], str]] = {
    "catalog_dir": (lambda s: str(s.catalog_path), "default (the demo catalog shipped with examlops)"),
    "database_url": (lambda s: s.sql_url, "derived from home"),
    "redis.url": (lambda s: s.redis_url, "default (embedded, on redis.port)"),
    "mlflow.tracking_uri": (lambda s: s.mlflow_tracking_uri, "derived from home"),
    "prefect.api_url": (lambda s: s.prefect_api_url, "default (embedded, on prefect.port)"),
    "token": (lambda s: f"read from {s.admin_token_path}", "default (the admin token `exa up` wrote)"),
    "bridge_token": (lambda s: f"read from {s.bridge_token_path}", "default (the bridge token `exa up` wrote)"),
    "ray.address": (lambda s: "none: a local cluster", "default (the Ray engine starts its own)"),
    "ray.num_cpus": (lambda s: str(os.cpu_count() or 1), "default (the machine's CPUs)"),
    "ray.temp_dir": (lambda s: str(s.state_dir / "ray"), "derived from home"),
    "ray.max_replicas": (lambda s: str(s.ray.num_replicas), "default (no autoscaling: ray.num_replicas)"),
}
"""Settings whose unset value means "derive it": dotted name -> (the effective value, its source)."""


def setting_sources(settings: Settings, environ: Mapping[str, str] | None = None) -> Iterator[tuple[str, Any, str]]:
    """Yield ``(dotted name, effective value, where it came from)`` for every leaf setting (contract above)."""
    env = {k.upper(): v for k, v in (os.environ if environ is None else environ).items()}

    def walk(model: BaseModel, prefix: list[str]) -> Iterator[tuple[str, Any, str]]:
        for name in type(model).model_fields:
            value = getattr(model, name)
            path = [*prefix, name]
            if isinstance(value, BaseModel):
                yield from walk(value, path)
                continue
            dotted = ".".join(path)
            var = ENV_PREFIX + NESTED_DELIMITER.join(p.upper() for p in path)
            section_var = ENV_PREFIX + path[0].upper()
            if var in env:
                source = f"env {var}"
            elif len(path) > 1 and section_var in env:
                source = f"env {section_var}"
            else:
                source = "default"
            if dotted in DERIVED and not value:  # unset (or set empty): the platform derives it
                derive, how = DERIVED[dotted]
                value, source = derive(settings), how if source == "default" else f"{source} (empty: {how})"
            elif isinstance(value, SecretStr):
                value = MASK
            elif isinstance(value, str) and "://" in value:
                value = without_password(value)
            elif isinstance(value, Path):
                value = str(value)
            elif isinstance(value, tuple):
                value = list(value)
            yield dotted, value, source

    yield from walk(settings, [])


def without_password(url: str) -> str:
    """A URL as it may be printed: its password, if any, replaced by the mask."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    user = f"{parts.username}:" if parts.username else ":"
    host = parts.netloc.rsplit("@", 1)[1]
    return urlunsplit(parts._replace(netloc=f"{user}{MASK}@{host}"))


def setting_description(dotted: str) -> str:
    """The docstring of one setting, for ``exa config show``."""
    model: type[BaseModel] = Settings
    parts = dotted.split(".")
    for part in parts[:-1]:
        annotation = model.model_fields[part].annotation
        assert isinstance(annotation, type) and issubclass(annotation, BaseModel)
        model = annotation
    return model.model_fields[parts[-1]].description or ""
