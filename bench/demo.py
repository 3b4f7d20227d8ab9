"""What the benches share before they start servers: a state folder with the demo models, and request bodies."""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from examlops.bootstrap import upgrade_database
from examlops.bootstrap.identity import provision_admin
from examlops.core.settings import Settings
from examlops.registry.catalog import Catalog, load_catalog
from examlops.registry.demo import seed_demo


def demo_state(home: Path) -> tuple[Settings, Catalog]:
    """``home`` made (if missing) and seeded as `exa up` does: the demo models registered, the SQL schema
    migrated, the ``admin`` identity made with its token in the state folder (the benches' bus clients sign
    with it, HTTP loads send it: ``admin_token``). Returns the settings of that folder and its catalog."""
    home.mkdir(parents=True, exist_ok=True)
    settings = Settings(home=home)
    catalog = load_catalog(settings.catalog_path)
    seed_demo(settings, catalog)
    upgrade_database(settings)
    provision_admin(settings)
    return settings, catalog


def admin_token(settings: Settings) -> str:
    """The admin token ``demo_state`` made (the state folder's ``admin.token``)."""
    return settings.admin_token_path.read_text().strip()


def auth_headers(settings: Settings) -> dict[str, str]:
    """The ``Authorization`` header of the admin token, for HTTP loads on the state folder of ``settings``."""
    return {"Authorization": f"Bearer {admin_token(settings)}"}


def bodies(dim: int, count: int, *, seed: int) -> list[dict[str, object]]:
    """``count`` request bodies of ``dim`` embedding values drawn near zero (``node_count`` 12), reproducible."""
    rng = np.random.default_rng(seed)
    return [{"embedding": [float(v) for v in rng.normal(0, 0.05, dim)], "node_count": 12} for _ in range(count)]


def add_on_setting(parser: argparse.ArgumentParser, who: str, flag: str = "--on-setting") -> None:
    """``--on-setting EXAMLOPS_NAME=VALUE`` (repeatable; ``flag`` names it otherwise): a setting of one side of
    the bench only (``who``); read it with ``on_settings``."""
    parser.add_argument(
        flag,
        dest="on_setting",
        action="append",
        default=[],
        metavar="EXAMLOPS_NAME=VALUE",
        help=f"A setting of the {who} only (repeatable), e.g. EXAMLOPS_TRACING__BATCH=256.",
    )


def on_settings(parser: argparse.ArgumentParser, args: argparse.Namespace) -> dict[str, str]:
    """The ``--on-setting`` values as environment variables; a usage error for one that is not one."""
    settings = dict(item.partition("=")[::2] for item in args.on_setting)
    if any(not name.startswith("EXAMLOPS_") or not value for name, value in settings.items()):
        parser.error("a setting takes EXAMLOPS_NAME=VALUE")
    return settings
