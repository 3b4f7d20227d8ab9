"""Seed the MLflow registry with three demo versions of every catalog model: two good ones and one that fails.

Each model gets two HistGradientBoosting versions trained on synthetic data
(different samples and hyperparameters), each logged in its own run of the
``examlops-demo`` experiment and registered under the catalog name; then
Production points at the first and Canary at the second. A third version,
Staging, fails on purpose while predicting (``faulty_regressor``), so that
``exa demo traffic --fail-rate`` can send real model failures and a user can
watch the retrain trigger fire; serving has no fault switch.

Idempotent: a model that already has Production, Canary and Staging is
skipped. A model lacking Production or Canary gets two new trained versions
and only the missing alias; one lacking Staging gets only a new failing
version. An alias a model has, whoever set it, is never moved.

Each alias is pointed with ``promotion.service.move_audited`` through ``trail``, as a retrain points its
candidate: with a trail (``bootstrap.serving.seed_demo_audited``, what `exa up` and `exa demo seed` run) its
intent and outcome go on the audit trail, so `exa audit verify` can tell when it is later moved outside
examlops; a trail that cannot be written stops the seed before that alias moves. Without one (tests, the
benchmarks) the alias is only set, and verify lists it as not covered by the trail.

The models come from ``demo_models``; logging and registering them from ``registration``, which
keeps every file under ``settings.state_dir`` when the store is local.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass

from examlops.core.errors import ModelNotFound
from examlops.core.settings import Settings
from examlops.promotion.service import move_audited
from examlops.promotion.trail import MoveTrail
from examlops.registry.catalog import Catalog, ModelSpec
from examlops.registry.demo_models import (
    FAULTY_SEED_OFFSET,
    FAULTY_SKOPS_TYPES,
    RECIPES,
    Recipe,
    faulty_regressor,
    seed_of,
    train,
)
from examlops.registry.mlflow_client import HttpLimits
from examlops.registry.mlflow_registry import MlflowRegistry
from examlops.registry.registration import ensure_experiment, log_and_register

DEMO_EXPERIMENT = "examlops-demo"
SEEDED_ALIASES = ("Production", "Canary")
"""The aliases of the two trained versions, in version order."""
FAULTY_ALIAS = "Staging"
FAULTY_DESCRIPTION = "demo: fails on purpose so the retrain trigger can be seen"
FAULTY_TAGS: Mapping[str, str] = {"examlops.demo": "fails-on-purpose"}


@dataclass(frozen=True, slots=True)
class SeedReport:
    """Which catalog models got new versions and which already had Production, Canary and Staging."""

    created: tuple[str, ...]
    skipped: tuple[str, ...]


def seed_demo(
    settings: Settings,
    catalog: Catalog,
    on_progress: Callable[[str], None] | None = None,
    *,
    trail: MoveTrail | None = None,
) -> SeedReport:
    """Register the demo versions every catalog model lacks (module docstring); skip models that lack none.

    Raises ``RegistryUnavailable`` when the store cannot be reached and
    another ``ExamlopsError`` when MLflow refuses a step, ``StoreUnavailable`` when ``trail`` cannot take an
    alias's intent; models finished before the failure stay seeded, so running it again completes the rest.
    """
    say = on_progress or (lambda _message: None)
    limits = HttpLimits(timeout_s=settings.mlflow.timeout_s, max_retries=settings.mlflow.max_retries)
    registry = MlflowRegistry(settings.mlflow_tracking_uri, settings.state_dir / "cache" / "models", limits=limits)
    created: list[str] = []
    skipped: list[str] = []
    experiment_id: str | None = None
    for spec in catalog:
        try:
            have = registry.aliases(spec.name)
        except ModelNotFound:
            have = {}
        if all(alias in have for alias in (*SEEDED_ALIASES, FAULTY_ALIAS)):
            say(f"{spec.name}: has {', '.join(SEEDED_ALIASES)} and {FAULTY_ALIAS}, skipped")
            skipped.append(spec.name)
            continue
        experiment_id = experiment_id or ensure_experiment(registry, settings, DEMO_EXPERIMENT)
        if not all(alias in have for alias in SEEDED_ALIASES):
            versions = []
            for number, recipe in enumerate(RECIPES, start=1):
                say(f"{spec.name}: training and logging demo version {number} of {len(RECIPES)}")
                versions.append(_train_and_register(registry, settings, experiment_id, spec, recipe))
            for alias, version in zip(SEEDED_ALIASES, versions, strict=True):
                if alias not in have:
                    move_audited(registry, spec.name, alias, version=version, trail=trail)
                    say(f"{spec.name}: {alias} -> version {version}")
        if FAULTY_ALIAS not in have:
            say(f"{spec.name}: logging the demo version that fails on purpose")
            version = _register_faulty(registry, settings, experiment_id, spec)
            move_audited(registry, spec.name, FAULTY_ALIAS, version=version, trail=trail)
            say(f"{spec.name}: {FAULTY_ALIAS} -> version {version} (fails on purpose)")
        created.append(spec.name)
    return SeedReport(created=tuple(created), skipped=tuple(skipped))


def _register_faulty(registry: MlflowRegistry, settings: Settings, experiment_id: str, spec: ModelSpec) -> str:
    """Log the failing version in its own run, described as failing on purpose; return its version number."""
    model = faulty_regressor(spec)
    metrics = {"train_seed": float(seed_of(spec, FAULTY_SEED_OFFSET))}  # no holdout RMSE: it cannot predict
    params = {"pipeline": "log -> LinearRegression", "purpose": FAULTY_DESCRIPTION}
    return log_and_register(
        registry, settings, experiment_id, spec, model, f"{spec.name}-demo-faulty", metrics, params,
        trusted_types=FAULTY_SKOPS_TYPES, description=FAULTY_DESCRIPTION, tags=FAULTY_TAGS,
    ).version  # fmt: skip


def _train_and_register(
    registry: MlflowRegistry, settings: Settings, experiment_id: str, spec: ModelSpec, recipe: Recipe
) -> str:
    """Train one version, log it in its own run and register it; return the new version number."""
    model, metrics = train(spec, recipe)
    params = {key: str(value) for key, value in asdict(recipe).items()}
    run_name = f"{spec.name}-demo-{recipe.seed_offset}"
    return log_and_register(registry, settings, experiment_id, spec, model, run_name, metrics, params).version
