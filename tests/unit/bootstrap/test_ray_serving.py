"""The Ray engine's choices made before Ray starts: settings, its folder, the engine option (no cluster)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError
from typer.testing import CliRunner

from examlops.bootstrap.ray_serving import RayUnavailable, cluster_token, ray_temp_dir, replica_settings
from examlops.cli.main import app as exa
from examlops.core.errors import AlreadyRunning, DependencyUnavailable
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


class FakeLease:
    """A ``Lease`` that the test steers: taken or not, held or lost to another driver."""

    def __init__(self, *, taken: bool = False) -> None:
        self.taken, self.mine, self.checks = taken, False, 0

    def take(self) -> None:
        if self.taken:
            raise AlreadyRunning("another examlops driver serves on the Ray cluster at ray-head:6379")
        self.taken = self.mine = True

    def held(self) -> bool:
        return self.mine

    def keep(self) -> bool:
        self.checks += 1
        if self.checks > 3:  # a watch that does not stop would otherwise loop until pytest's timeout
            raise AssertionError(f"the lease was checked {self.checks} times: the watch did not stop")
        return self.mine


@pytest.fixture
def joined(monkeypatch: pytest.MonkeyPatch) -> tuple[Any, dict[str, None], list[str]]:
    """A driver of a joined cluster, with Serve's applications and the artifact store as dicts and lists."""
    pytest.importorskip("ray", reason="the Ray engine needs the ray extra (pip install 'examlops[ray]')")
    from ray import serve

    from examlops.bootstrap.ray_serving import RayServingProcess
    from examlops.serving import ray_artifacts

    apps: dict[str, None] = {"examlops": None, "examlops-model-JPCP": None, "other": None}
    gone: list[str] = []
    monkeypatch.setenv("RAY_USAGE_STATS_ENABLED", "0")  # what the process would set, undone after the test
    monkeypatch.setattr(serve, "status", lambda: type("Status", (), {"applications": dict(apps)}))
    monkeypatch.setattr(serve, "delete", lambda name: (gone.append(name), apps.pop(name)))
    monkeypatch.setattr(ray_artifacts, "kill_store", lambda: gone.append("store"))
    return RayServingProcess(Settings(ray={"address": "ray-head:6379"})), apps, gone


def test_joining_a_cluster_whose_driver_holds_the_lease_is_refused_and_deletes_nothing(joined: Any) -> None:
    proc, _, gone = joined
    with pytest.raises(AlreadyRunning, match="ray-head:6379"):
        proc._claim_cluster(FakeLease(taken=True))
    proc._delete_applications()  # what ``run`` would do on its way out: not without the lease
    assert gone == []


def test_a_stopped_drivers_applications_are_deleted_and_its_store_is_killed_even_with_no_application(
    joined: Any,
) -> None:
    proc, apps, gone = joined
    proc._claim_cluster(FakeLease())
    assert gone == ["examlops", "examlops-model-JPCP", "store"]  # another team's application stays
    assert list(apps) == ["other"]
    gone.clear()
    proc._claim_cluster(FakeLease())  # nothing of ours runs: the store may still have been left
    assert gone == ["store"]


def test_a_driver_that_lost_the_lease_to_another_stops_and_leaves_the_applications(joined: Any) -> None:
    proc, apps, gone = joined
    lease = FakeLease()
    proc._claim_cluster(lease)
    apps["examlops"] = None  # the other driver's ingress, once this one lost the lease
    gone.clear()
    lease.mine = False
    proc.watch_lease(every_s=0.001)  # returns once it saw the lease gone
    assert lease.checks == 1
    proc._delete_applications()
    assert gone == [] and "examlops" in apps
