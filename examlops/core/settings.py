"""The one settings object, read from ``EXAMLOPS_*`` environment variables.

Sections are plain ``BaseModel``s joined with ``__``: ``EXAMLOPS_PREDICT__WORKERS=2``
sets ``settings.predict.workers``. Every limit of seed 000 is here with the
seed's default. Build it once (``Settings()``) in a composition root and pass
it down; nothing reads the environment anywhere else.

Everything the platform writes at run time goes under ``home`` (the state
folder, ``.examlops/`` under the working directory by default).
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from examlops.core.control_sections import LoopSettings, UpSettings
from examlops.core.server_sections import MlflowSettings, PrefectSettings, RaySettings, RedisSettings
from examlops.core.setting_sections import (
    AdmissionSettings,
    AuditSettings,
    AuthSettings,
    BatchSettings,
    BusSettings,
    FailureSettings,
    HotSetSettings,
    HttpSettings,
    JobsSettings,
    LogSettings,
    PredictSettings,
    RecordingSettings,
    ServingSettings,
    TracingSettings,
    TrafficSettings,
)

ENV_PREFIX = "EXAMLOPS_"
NESTED_DELIMITER = "__"
DEV_SECRET = "dev-only-change-me"
DEFAULT_EMBEDDING_DIM = 384
"""Seed 000, step 5: every embedding has 384 values unless the catalog or ``EXAMLOPS_EMBEDDING_DIM`` says otherwise."""


class Settings(BaseSettings):
    """Every setting of examlops, read once from the environment."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        env_nested_delimiter=NESTED_DELIMITER,
        env_file=None,
        extra="ignore",
        use_attribute_docstrings=True,
        frozen=True,
    )

    home: Path = Path(".examlops")
    """The state folder: every file the platform writes at run time goes here."""
    catalog_dir: Path | None = None
    """Folder of model catalog YAMLs; unset, the demo catalog shipped with examlops."""
    database_url: str | None = None
    """SQLModel database URL; unset, SQLite in the state folder. A Postgres URL for several machines."""
    environment: str = "development"
    """development or production; production refuses the development secret."""
    secret: SecretStr = SecretStr(DEV_SECRET)
    """Key for job signatures and audit checkpoints."""
    token: SecretStr | None = None
    """The bearer token `exa` commands send to the platform (EXAMLOPS_TOKEN); unset, the state folder's
    admin.token that `exa up` wrote."""
    bridge_token: SecretStr | None = None
    """The bearer token a bus bridge presents to serving (EXAMLOPS_BRIDGE_TOKEN), an identity with the bridge
    role; unset, the state folder's bridge.token that `exa up` wrote, else the platform token."""
    embedding_dim: int = Field(DEFAULT_EMBEDDING_DIM, ge=1)
    """Length of an embedding whose catalog YAML gives no length (seed 000, step 5)."""

    http: HttpSettings = HttpSettings()
    batch: BatchSettings = BatchSettings()
    traffic: TrafficSettings = TrafficSettings()
    predict: PredictSettings = PredictSettings()
    admission: AdmissionSettings = AdmissionSettings()
    jobs: JobsSettings = JobsSettings()
    hotset: HotSetSettings = HotSetSettings()
    failure: FailureSettings = FailureSettings()
    loop: LoopSettings = LoopSettings()
    audit: AuditSettings = AuditSettings()
    recording: RecordingSettings = RecordingSettings()
    bus: BusSettings = BusSettings()
    tracing: TracingSettings = TracingSettings()
    auth: AuthSettings = AuthSettings()
    serving: ServingSettings = ServingSettings()
    ray: RaySettings = RaySettings()
    logs: LogSettings = LogSettings()
    redis: RedisSettings = RedisSettings()
    mlflow: MlflowSettings = MlflowSettings()
    prefect: PrefectSettings = PrefectSettings()
    up: UpSettings = UpSettings()

    @field_validator("environment")
    @classmethod
    def _known_environment(cls, value: str) -> str:
        if value not in ("development", "production"):
            raise ValueError("must be 'development' or 'production'")
        return value

    @model_validator(mode="after")
    def _no_dev_secret_in_production(self) -> Settings:
        if self.environment == "production" and self.secret.get_secret_value() == DEV_SECRET:
            raise ValueError("EXAMLOPS_SECRET must be set to a real secret when EXAMLOPS_ENVIRONMENT=production")
        return self

    @model_validator(mode="after")
    def _auth_off_only_in_development(self) -> Settings:
        if not self.auth.enabled and self.environment != "development":
            raise ValueError("EXAMLOPS_AUTH__ENABLED=false is allowed only when EXAMLOPS_ENVIRONMENT=development")
        return self

    # Derived locations. All of them live under `home` unless a URL says otherwise.

    @property
    def state_dir(self) -> Path:
        return self.home.resolve()

    @property
    def run_dir(self) -> Path:
        return self.state_dir / "run"

    @property
    def log_dir(self) -> Path:
        return self.state_dir / "logs"

    @property
    def catalog_path(self) -> Path:
        if self.catalog_dir is not None:
            return self.catalog_dir
        return Path(__file__).resolve().parent.parent / "catalog"

    @property
    def mlflow_dir(self) -> Path:
        return self.state_dir / "mlflow"

    @property
    def mlflow_tracking_uri(self) -> str:
        return self.mlflow.tracking_uri or f"sqlite:///{self.mlflow_dir / 'mlflow.db'}"

    @property
    def mlflow_artifact_root(self) -> Path:
        return self.mlflow_dir / "artifacts"

    @property
    def sql_url(self) -> str:
        return self.database_url or f"sqlite:///{self.state_dir / 'examlops.db'}"

    @property
    def redis_url(self) -> str:
        return self.redis.url or f"redis://127.0.0.1:{self.redis.port}/0"

    @property
    def redis_owned(self) -> bool:
        return self.redis.url is None

    @property
    def bridge_token_path(self) -> Path:
        """Where `exa up` keeps the ``bridge`` identity's token (mode 0600), which its bridges present."""
        return self.state_dir / "bridge.token"

    @property
    def admin_token_path(self) -> Path:
        """Where `exa up` keeps the first admin identity's token (mode 0600)."""
        return self.state_dir / "admin.token"

    @property
    def prefect_home(self) -> Path:
        return self.state_dir / "prefect"

    @property
    def prefect_api_url(self) -> str:
        return self.prefect.api_url or f"http://127.0.0.1:{self.prefect.port}/api"


__all__ = [
    "DEFAULT_EMBEDDING_DIM",
    "DEV_SECRET",
    "ENV_PREFIX",
    "NESTED_DELIMITER",
    "AdmissionSettings",
    "AuditSettings",
    "AuthSettings",
    "BatchSettings",
    "BusSettings",
    "FailureSettings",
    "HotSetSettings",
    "HttpSettings",
    "LogSettings",
    "LoopSettings",
    "MlflowSettings",
    "PredictSettings",
    "PrefectSettings",
    "RaySettings",
    "RecordingSettings",
    "RedisSettings",
    "ServingSettings",
    "Settings",
    "TracingSettings",
    "TrafficSettings",
]
