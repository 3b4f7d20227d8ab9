"""A catalog of JPCP alone, for the scenarios that serve only JPCP.

Seeding the other demo models and loading them in serving costs CPU for nothing there; serving and the bridges
read the copy through ``EXAMLOPS_CATALOG_DIR`` (as ``test_model_faults`` does with its own catalog).
"""

from __future__ import annotations

import shutil
from pathlib import Path

from examlops.core.settings import Settings
from examlops.registry.catalog import Catalog, load_catalog


def jpcp_only(folder: Path) -> tuple[Path, Catalog]:
    """``folder`` holding the project catalog's JPCP entry alone, and that catalog loaded."""
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copy(Settings().catalog_path / "jpcp.yaml", folder / "jpcp.yaml")
    return folder, load_catalog(folder)
