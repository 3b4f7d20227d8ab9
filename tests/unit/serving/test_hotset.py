"""The hot set: aliases loaded at start-up, pinned versions in an LRU, reloads that load before they release."""

from __future__ import annotations

import pytest

from examlops.core.errors import AliasNotFound, NotReady, RegistryUnavailable, VersionNotFound
from examlops.serving.hotset import HotSet
from tests.unit.serving.fakes import FakeClock, InMemoryModelSource, RecordingRuntime, make_catalog


def registry() -> InMemoryModelSource:
    source = InMemoryModelSource()
    source.add("JPCP", "1", "Production")
    source.add("JPCP", "2", "Canary")
    for version in ("3", "4", "5"):
        source.add("JPCP", version)
    source.add("CRCP", "1", "Production", "Staging")
    return source


def hotset(source: InMemoryModelSource, runtime: RecordingRuntime, *names: str, cache: int = 8) -> HotSet:
    catalog = make_catalog(*(names or ("JPCP", "CRCP")))
    return HotSet(catalog, source, runtime, version_cache_size=cache, clock=FakeClock())


def states(hs: HotSet) -> dict[tuple[str, str | None], tuple[str | None, str]]:
    return {(e.model, e.alias): (e.version, e.state) for e in hs.entries()}


async def test_start_up_loads_every_existing_alias_once_per_version() -> None:
    runtime = RecordingRuntime()
    hs = hotset(registry(), runtime)
    await hs.load_all()
    assert sorted(runtime.loads) == ["CRCP/1", "JPCP/1", "JPCP/2"]  # CRCP/1 serves two aliases, loaded once
    assert states(hs) == {
        ("JPCP", "Production"): ("1", "ready"),
        ("JPCP", "Canary"): ("2", "ready"),
        ("JPCP", "Staging"): (None, "missing"),
        ("CRCP", "Production"): ("1", "ready"),
        ("CRCP", "Canary"): (None, "missing"),
        ("CRCP", "Staging"): ("1", "ready"),
    }
    assert hs.available_aliases("jpcp") == {"Production", "Canary"}
    assert hs.missing_defaults() == []


async def test_one_model_failing_to_load_does_not_stop_the_others() -> None:
    runtime = RecordingRuntime(fail_load={"JPCP/2"})
    hs = hotset(registry(), runtime, "JPCP", "CRCP", "AC")
    await hs.load_all()
    infos = {(e.model, e.alias): e for e in hs.entries()}
    assert infos["AC", "Production"].state == "error" and "no model AC" in (infos["AC", "Production"].reason or "")
    assert infos["JPCP", "Canary"].state == "error" and "corrupt" in (infos["JPCP", "Canary"].reason or "")
    assert infos["JPCP", "Production"].state == infos["CRCP", "Production"].state == "ready"
    assert hs.missing_defaults() == ["AC"]
    with pytest.raises(NotReady, match="corrupt"):
        await hs.get("JPCP", "Canary")


async def test_aliases_match_case_insensitively_and_the_default_applies_when_none_is_named() -> None:
    hs = hotset(registry(), RecordingRuntime())
    await hs.load_all()
    assert (await hs.get("jpcp", "canary")).ref.version == "2"
    assert (await hs.get("JPCP")).alias == "Production"
    with pytest.raises(AliasNotFound):
        await hs.get("JPCP", "Staging")
    with pytest.raises(AliasNotFound):
        await hs.get("JPCP", "Shadow")


async def test_pinned_versions_stay_loaded_in_an_lru() -> None:
    source, runtime = registry(), RecordingRuntime()
    hs = hotset(source, runtime, cache=2)
    await hs.load_all()
    for version in ("3", "4", "3", "5"):  # 4 is the least recently used when 5 arrives
        assert (await hs.get("JPCP", version=version)).ref.version == version
    await hs.settle()
    assert runtime.unloads == ["JPCP/4"]
    assert {e.version for e in hs.entries() if e.alias is None} == {"3", "5"}
    assert runtime.loads.count("JPCP/3") == 1
    with pytest.raises(VersionNotFound):
        await hs.get("JPCP", version="99")


async def test_evicting_a_pinned_version_an_alias_still_uses_does_not_unload_it() -> None:
    source, runtime = registry(), RecordingRuntime()
    hs = hotset(source, runtime, cache=1)
    await hs.load_all()
    await hs.get("JPCP", version="1")  # Production's version: no registry trip, no second load
    await hs.get("JPCP", version="3")
    assert runtime.loads.count("JPCP/1") == 1 and "JPCP/1" not in runtime.unloads
    assert ("version", "JPCP", "1") not in source.calls


async def test_reload_loads_the_new_version_before_it_releases_the_old_one() -> None:
    source, runtime = registry(), RecordingRuntime()
    hs = hotset(source, runtime)
    await hs.load_all()
    source.move("JPCP", "Production", "3")
    (change,) = await hs.reload("jpcp")
    await hs.settle()
    assert (change.alias, change.old_version, change.new_version, change.outcome) == ("Production", "1", "3", "swapped")
    assert runtime.events.index(("load", "JPCP/3")) < runtime.events.index(("unload", "JPCP/1"))
    assert (await hs.get("JPCP")).ref.version == "3"
    assert await hs.reload() == []  # nothing moved since


async def test_a_bad_new_version_is_refused_and_the_old_one_keeps_serving_degraded() -> None:
    source, runtime = registry(), RecordingRuntime(fail_load={"JPCP/3"})
    hs = hotset(source, runtime)
    await hs.load_all()
    source.move("JPCP", "Production", "3")
    (change,) = await hs.reload("JPCP")
    assert change.outcome == "refused" and "corrupt" in (change.reason or "")
    entry = await hs.get("JPCP")
    assert (entry.ref.version, entry.state) == ("1", "degraded")
    info = next(e for e in hs.entries() if (e.model, e.alias) == ("JPCP", "Production"))
    assert info.state == "degraded" and "version 3 refused" in (info.reason or "")
    assert "JPCP/1" not in runtime.unloads
    source.move("JPCP", "Production", "1")  # the registry goes back: the entry is healthy again
    assert await hs.reload("JPCP") == []
    assert (await hs.get("JPCP")).state == "ready"


async def test_an_unreachable_registry_keeps_everything_and_marks_it_stale() -> None:
    source, runtime = registry(), RecordingRuntime()
    hs = hotset(source, runtime)
    await hs.load_all()
    source.unavailable = True
    changes = await hs.reload()
    assert {c.outcome for c in changes} == {"unreachable"}
    assert (await hs.get("JPCP")).ref.version == "1" and runtime.unloads == []
    assert all("stale" in (e.reason or "") for e in hs.entries() if e.state == "ready")
    with pytest.raises(RegistryUnavailable):
        await hs.get("JPCP", version="4")


async def test_a_removed_alias_is_released_and_no_longer_available() -> None:
    source, runtime = registry(), RecordingRuntime()
    hs = hotset(source, runtime)
    await hs.load_all()
    source.remove_alias("JPCP", "Canary")
    (change,) = await hs.reload("JPCP")
    await hs.settle()
    assert change.outcome == "removed" and runtime.unloads == ["JPCP/2"]
    assert hs.available_aliases("JPCP") == {"Production"}


async def test_a_version_in_use_is_released_only_when_its_last_request_lets_go() -> None:
    source, runtime = registry(), RecordingRuntime()
    hs = hotset(source, runtime)
    await hs.load_all()
    held = await hs.acquire("JPCP")
    source.move("JPCP", "Production", "3")
    await hs.reload("JPCP")
    await hs.settle()
    assert "JPCP/1" not in runtime.unloads and (await hs.get("JPCP")).ref.version == "3"
    hs.release(held)
    await hs.settle()
    assert runtime.unloads == ["JPCP/1"]


async def test_a_version_shared_by_two_aliases_is_unloaded_only_when_both_moved() -> None:
    source, runtime = registry(), RecordingRuntime()
    hs = hotset(source, runtime)
    await hs.load_all()
    source.move("CRCP", "Staging", "1")
    source.add("CRCP", "2")
    source.move("CRCP", "Production", "2")
    await hs.reload("CRCP")
    await hs.settle()
    assert "CRCP/1" not in runtime.unloads
    source.move("CRCP", "Staging", "2")
    await hs.reload("CRCP")
    await hs.settle()
    assert runtime.unloads == ["CRCP/1"] and runtime.loads.count("CRCP/2") == 1


async def test_an_alias_not_loaded_yet_is_not_ready_rather_than_not_found() -> None:
    hs = hotset(registry(), RecordingRuntime())
    with pytest.raises(NotReady, match="not loaded yet"):
        await hs.get("JPCP")
