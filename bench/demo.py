"""What the benches share before they start servers: a state folder with the demo models, and request bodies."""

from __future__ import annotations

import secrets
from pathlib import Path

import numpy as np

from examlops.bootstrap import upgrade_database
from examlops.core.settings import Settings
from examlops.registry.catalog import Catalog, load_catalog
from examlops.registry.demo import seed_demo


def demo_state(home: Path) -> tuple[Settings, Catalog]:
    """``home`` made (if missing) and seeded as `exa up` does: the demo models registered, the SQL schema
    migrated, a platform token where `exa up` keeps the admin's (the benches' bridges know it, their bus
    clients sign with it). Returns the settings of that folder and its catalog."""
    home.mkdir(parents=True, exist_ok=True)
    settings = Settings(home=home)
    if not settings.admin_token_path.exists():
        settings.admin_token_path.parent.mkdir(parents=True, exist_ok=True)
        settings.admin_token_path.write_text(f"exa_{secrets.token_hex(8)}_{secrets.token_urlsafe(32)}\n")
        settings.admin_token_path.chmod(0o600)
    catalog = load_catalog(settings.catalog_path)
    seed_demo(settings, catalog)
    upgrade_database(settings)
    return settings, catalog


def bodies(dim: int, count: int, *, seed: int) -> list[dict[str, object]]:
    """``count`` request bodies of ``dim`` embedding values drawn near zero (``node_count`` 12), reproducible."""
    rng = np.random.default_rng(seed)
    return [{"embedding": [float(v) for v in rng.normal(0, 0.05, dim)], "node_count": 12} for _ in range(count)]
