"""The Ray engine's choices made before Ray starts: settings, its folder, the engine option (no cluster)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError
from typer.testing import CliRunner

from examlops.bootstrap.ray_serving import RayUnavailable, cluster_token, ray_temp_dir, replica_settings
from examlops.cli.main import app as exa
from examlops.core.errors import DependencyUnavailable
from examlops.core.settings import Settings


def test_the_default_engine_is_uvicorn_and_ray_is_chosen_by_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    assert Settings().serving.engine == "uvicorn"
    monkeypatch.setenv("EXAMLOPS_SERVING__ENGINE", "ray")
    monkeypatch.setenv("EXAMLOPS_RAY__MAX_REPLICAS", "3")
    settings = Settings()
    assert (settings.serving.engine, settings.ray.min_replicas, settings.ray.max_replicas) == ("ray", 1, 3)


def test_autoscaling_bounds_are_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EXAMLOPS_RAY__MIN_REPLICAS", "4")
    monkeypatch.setenv("EXAMLOPS_RAY__MAX_REPLICAS", "2")
    with pytest.raises(ValidationError, match="min_replicas"):
        Settings()


def test_scaling_a_model_to_zero_is_refused_with_the_setting_to_change(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EXAMLOPS_RAY__MIN_REPLICAS", "0")
    monkeypatch.setenv("EXAMLOPS_RAY__MAX_REPLICAS", "2")
    with pytest.raises(ValidationError, match="EXAMLOPS_RAY__MIN_REPLICAS=1"):
        Settings()


def test_rays_folder_is_under_the_state_folder_and_a_path_too_long_for_its_sockets_is_refused() -> None:
    short = Path("/tmp/h")  # nothing is created: only the paths are checked
    assert ray_temp_dir(Settings(home=short)) == short / "ray"
    deep = Path("/tmp") / ("x" * 40)
    with pytest.raises(RayUnavailable, match="EXAMLOPS_RAY__TEMP_DIR") as refused:
        ray_temp_dir(Settings(home=deep))
    assert isinstance(refused.value, DependencyUnavailable)
    assert ray_temp_dir(Settings(home=deep, ray={"temp_dir": short})) == short


def test_the_cluster_token_is_made_once_and_kept_owner_only(tmp_path: Path) -> None:
    path = tmp_path / "auth_token"
    token = cluster_token(path)
    assert len(token) == 64 and cluster_token(path) == token
    assert path.stat().st_mode & 0o077 == 0


def test_replicas_get_absolute_paths(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    settings = replica_settings(Settings(home=Path("state"), catalog_dir=Path("catalog")))
    assert (settings.home, settings.catalog_dir) == (tmp_path / "state", tmp_path / "catalog")


def test_serve_start_refuses_an_unknown_engine() -> None:
    result = CliRunner().invoke(exa, ["serve", "start", "--engine", "tornado"])
    assert result.exit_code == 2
    assert "unknown engine" in result.output


def test_joining_a_cluster_whose_driver_holds_the_lease_is_refused_and_a_stopped_drivers_apps_are_taken_over(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pytest.importorskip("ray", reason="the Ray engine needs the ray extra (pip install 'examlops[ray]')")
    from ray import serve
    from ray.exceptions import ActorAlreadyExistsError

    from examlops.bootstrap.ray_serving import RayServingProcess
    from examlops.core.errors import AlreadyRunning

    def taken() -> Any:
        raise ActorAlreadyExistsError("The name examlops-driver (namespace=examlops) is already taken")

    apps = {"examlops": None, "examlops-model-JPCP": None, "other": None}
    monkeypatch.setenv("RAY_USAGE_STATS_ENABLED", "0")  # what the process would set, undone after the test
    monkeypatch.setattr(serve, "status", lambda: type("Status", (), {"applications": dict(apps)}))
    proc = RayServingProcess(Settings(ray={"address": "ray-head:6379"}))
    deleted: list[str] = []
    monkeypatch.setattr(proc, "_delete_applications", lambda: deleted.append("ours"))
    with pytest.raises(AlreadyRunning, match=r"ray-head:6379 \(it holds the actor examlops-driver\)"):
        proc._claim_cluster(taken)
    assert deleted == []

    proc._claim_cluster(lambda: "lease")  # no lease: the applications are a stopped driver's
    assert deleted == ["ours"]
    apps.pop("examlops"), apps.pop("examlops-model-JPCP")
    proc._claim_cluster(lambda: "lease")  # another team's application is not ours to delete
    assert deleted == ["ours"]
