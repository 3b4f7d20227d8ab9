"""A local route from a wiring file: which shipped loader, its arguments, and the route's two switches.

```yaml
routes:
  jpcp:
    adapter: local
    loader: mlflow            # mlflow | skops | joblib | callable
    model_uri: models:/JPCP@Production
    tracking_uri: sqlite:////var/examlops/mlflow.db
    output_field: score
    serialize_calls: false    # default
    warm_on_startup: true     # default
```

``skops`` takes ``path`` and ``trusted_types``, ``joblib`` takes ``path`` (an unpickle: your own files
only), ``callable`` takes ``ref: package.module:function`` naming a ``Loader`` of your own. A route that
does not parse is ``InferenceError`` VALIDATION ``inference_wiring_invalid`` naming the route.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from examlops.inference.adapters.local import LocalTarget
from examlops.inference.errors import InferenceError, Kind
from examlops.inference.loaders import Loader, joblib_file, mlflow_model, skops_file


class _Route(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    warm_on_startup: bool = True
    serialize_calls: bool = False


class MlflowRoute(_Route):
    loader: Literal["mlflow"]
    model_uri: str
    tracking_uri: str
    output_field: str = "prediction"
    cache_dir: Path | None = None

    def build(self) -> Loader:
        return mlflow_model(
            self.model_uri, tracking_uri=self.tracking_uri, output_field=self.output_field, cache_dir=self.cache_dir
        )


class SkopsRoute(_Route):
    loader: Literal["skops"]
    path: Path
    trusted_types: list[str] = []
    output_field: str = "prediction"

    def build(self) -> Loader:
        return skops_file(self.path, trusted_types=self.trusted_types, output_field=self.output_field)


class JoblibRoute(_Route):
    loader: Literal["joblib"]
    path: Path
    output_field: str = "prediction"

    def build(self) -> Loader:
        return joblib_file(self.path, output_field=self.output_field)


class CallableRoute(_Route):
    loader: Literal["callable"]
    ref: str = Field(pattern=r"^[\w.]+:[\w.]+$")

    def build(self) -> Loader:
        module, _, attr = self.ref.partition(":")
        found: Any = importlib.import_module(module)
        for part in attr.split("."):
            found = getattr(found, part)
        if not callable(found):
            raise TypeError(f"{self.ref} is not callable")
        loader: Loader = found
        return loader


LocalRoute = Annotated[MlflowRoute | SkopsRoute | JoblibRoute | CallableRoute, Field(discriminator="loader")]
_ROUTE: TypeAdapter[MlflowRoute | SkopsRoute | JoblibRoute | CallableRoute] = TypeAdapter(LocalRoute)


def local_target(route: str, config: Any) -> LocalTarget:
    """The ``LocalTarget`` a wiring file's mapping describes; VALIDATION ``inference_wiring_invalid`` otherwise."""
    try:
        parsed = _ROUTE.validate_python(config)
        return LocalTarget(
            parsed.build(), warm_on_startup=parsed.warm_on_startup, serialize_calls=parsed.serialize_calls
        )
    except (ValidationError, ImportError, AttributeError, TypeError) as exc:
        raise InferenceError(
            Kind.VALIDATION,
            f"the local route {route!r} is not valid: {exc}"[:800],
            code="inference_wiring_invalid",
            backend="local",
            route=route,
        ) from exc
