"""The hot set's background retries: without limit for failures that may pass, a few times for a broken version."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

import pytest

from examlops.core.backoff import Backoff
from examlops.core.errors import ModelLoadTimeout
from examlops.serving.hotset import LOAD_TRIES, HotSet, ReloadChange
from examlops.serving.upkeep import Upkeep, load_unloaded
from tests.unit.serving.fakes import InMemoryModelSource, RecordingRuntime, make_catalog

pytestmark = pytest.mark.looptime  # the backoff's waits are virtual time

QUICK = Backoff(0.01, 0.05)


@dataclass
class FlakyRuntime(RecordingRuntime):
    """Loads of ``flaky`` fail ``timeouts`` times with a retryable timeout (a busy cluster), then load."""

    flaky: str = ""
    timeouts: int = 0

    async def load(self, key: str, location: str) -> None:
        if key == self.flaky and self.timeouts > 0:
            self.loads.append(key)
            self.timeouts -= 1
            raise ModelLoadTimeout(f"{key}: the replicas did not report in time")
        await super().load(key, location)


def hotset_of(runtime: RecordingRuntime, *names: str) -> tuple[HotSet, InMemoryModelSource]:
    source = InMemoryModelSource()
    source.add("JPCP", "1", "Production")
    source.add("JPCP", "2", "Canary")
    return HotSet(make_catalog(*(names or ("JPCP",))), source, runtime), source


async def test_a_version_that_never_loads_is_retried_a_few_times_then_left_to_reloads(
    caplog: pytest.LogCaptureFixture,
) -> None:
    runtime = RecordingRuntime(fail_load={"JPCP/2"})  # a broken Canary
    hotset, _ = hotset_of(runtime)
    await hotset.load_all()
    assert hotset.unloaded_models() == ["JPCP"]
    rounds: list[int] = []
    with caplog.at_level(logging.WARNING, logger="examlops.serving.hotset"):
        async with asyncio.timeout(60):  # without a limit the loop never ends
            await load_unloaded(hotset, QUICK, lambda: rounds.append(runtime.loads.count("JPCP/2")))
    assert runtime.loads.count("JPCP/2") == LOAD_TRIES == 4  # the load at start and three retries
    assert rounds == [2, 3, 4]
    assert hotset.unloaded_models() == []
    assert len([r for r in caplog.records if "left to reloads" in r.getMessage()]) == 1
    [canary] = [e for e in hotset.entries() if e.alias == "Canary"]
    assert canary.state == "error"  # still listed with why, and a reload still tries it
    assert [c.outcome for c in await hotset.reload()] == ["refused"]


async def test_a_failure_that_may_pass_is_retried_until_it_does() -> None:
    runtime = FlakyRuntime(flaky="JPCP/2", timeouts=2 * LOAD_TRIES)
    hotset, _ = hotset_of(runtime)
    await hotset.load_all()
    async with asyncio.timeout(60):
        await load_unloaded(hotset, QUICK, lambda: None)
    assert runtime.loads.count("JPCP/2") == 2 * LOAD_TRIES + 1
    assert {(e.alias, e.state) for e in hotset.entries()} >= {("Canary", "ready"), ("Production", "ready")}


async def test_a_new_version_of_a_given_up_alias_gets_its_own_tries() -> None:
    runtime = RecordingRuntime(fail_load={"JPCP/2", "JPCP/3"})
    hotset, source = hotset_of(runtime)
    await hotset.load_all()
    async with asyncio.timeout(60):
        await load_unloaded(hotset, QUICK, lambda: None)
    source.add("JPCP", "3")
    source.move("JPCP", "Canary", "3")  # the alias moves to another version, broken too
    await hotset.reload()
    assert hotset.unloaded_models() == ["JPCP"]
    runtime.fail_load.discard("JPCP/3")
    async with asyncio.timeout(60):
        await load_unloaded(hotset, QUICK, lambda: None)
    assert [e.version for e in hotset.entries() if e.alias == "Canary" and e.state == "ready"] == ["3"]


async def test_unloaded_models_names_a_failed_alias_not_given_up_or_a_default_alias_not_held() -> None:
    runtime = RecordingRuntime(fail_load={"JPCP/2", "AC/5"})
    hotset, source = hotset_of(runtime, "JPCP", "CRCP", "AC")
    source.add("AC", "5", "Production")  # a broken default alias
    assert hotset.unloaded_models() == ["JPCP", "CRCP", "AC"]  # nothing loaded yet: every default alias
    await hotset.load_all()
    # JPCP: its Canary failed; CRCP: no Production in the registry yet; AC: its Production failed.
    assert hotset.unloaded_models() == ["JPCP", "CRCP", "AC"]
    for _ in range(LOAD_TRIES):
        await asyncio.gather(*(hotset.load_model(name) for name in ("JPCP", "CRCP", "AC")))
    assert runtime.loads.count("JPCP/2") == LOAD_TRIES  # given up: load_model no longer tries it
    assert runtime.loads.count("AC/5") == LOAD_TRIES + 1
    # The default aliases are retried without limit, as before: the service is not ready without them.
    assert hotset.unloaded_models() == ["CRCP", "AC"]


async def test_an_upkeep_closed_while_the_first_load_ran_starts_no_loop() -> None:
    hotset, _ = hotset_of(RecordingRuntime())
    polls: list[int] = []

    async def reload() -> list[ReloadChange]:
        polls.append(1)
        return []

    upkeep = Upkeep(hotset, QUICK)
    await upkeep.close()  # the pipeline closed while its start awaited the hot set's first load
    upkeep.start(reload, 0.01)
    await asyncio.sleep(1.0)
    assert polls == []
    live = Upkeep(hotset, QUICK)  # the same start on an open upkeep polls
    live.start(reload, 0.01)
    await asyncio.sleep(0.05)
    await live.close()
    assert polls
