"""The hot set's background upkeep: aliases that failed to load at start, and the reload poll.

``Upkeep`` is a pipeline's: it runs both loops below as tasks (one loading loop at a time, started again
by ``reloaded`` when a reload left something unloaded), cancels them on ``close`` (and starts none after
it), and is ``ready`` once every default alias has loaded (it stays so).

Contracts: ``load_unloaded`` retries the models with an alias whose load failed (any alias: a Staging
that failed once at start would otherwise stay out until an alias moves) or whose default alias is not
loaded, until none is left, waiting by a ``Backoff`` between rounds and calling ``after_round`` after each.
Errors that may pass (``retryable``) are retried without limit; a version that failed for its own reasons
only ``hotset.LOAD_TRIES`` times in all, then reloads take it over (``HotSet.unloaded_models``).
``poll_reload`` follows moved aliases every ``every_s``, one reload at a time (the next wait starts when
the last reload ended, so a registry that hangs never piles calls up); each poll that finds the registry
unreachable doubles the wait, up to ``poll_backoff_ceiling(every_s)``, and the first poll that reaches it
resets it.

Failure mode: neither loop ever raises for a failed round (it is logged); both end only when cancelled,
``load_unloaded`` also when nothing is left to load.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from examlops.core.backoff import Backoff
from examlops.serving.hotset import HotSet, ReloadChange

log = logging.getLogger(__name__)


def poll_backoff_ceiling(every_s: float) -> float:
    """The longest wait between polls while the registry is unreachable: 8 intervals, at most 10 minutes
    (but never less than one interval)."""
    return max(every_s, min(every_s * 8, 600.0))


async def load_unloaded(hotset: HotSet, backoff: Backoff, after_round: Callable[[], None]) -> None:
    """Retry the models ``hotset.unloaded_models`` names until it names none (contract above)."""
    failures = 0
    while unloaded := hotset.unloaded_models():
        failures += 1
        await asyncio.sleep(backoff.delay(failures))
        await asyncio.gather(*(hotset.load_model(name) for name in unloaded))
        after_round()
        left = hotset.unloaded_models()
        if left:
            log.warning("aliases still not loaded after %d retries: %s (retrying)", failures, ", ".join(left))


async def poll_reload(reload: Callable[[], Awaitable[list[ReloadChange]]], every_s: float) -> None:
    """Call ``reload`` every ``every_s``, backing off while the registry is unreachable (contract above)."""
    backoff = Backoff(every_s, poll_backoff_ceiling(every_s))
    unreachable_polls = 0
    while True:
        await asyncio.sleep(backoff.delay(unreachable_polls + 1))
        try:
            changes = await reload()
        except Exception:
            log.exception("polling the registry for moved aliases failed")
            changes, unreachable = [], True
        else:
            unreachable = any(change.outcome == "unreachable" for change in changes)
        if unreachable:
            unreachable_polls += 1
            log.warning(
                "the model registry is unreachable; serving what is loaded, next poll in %g s",
                backoff.delay(unreachable_polls + 1),
            )
        else:
            unreachable_polls = 0
        for change in changes:
            if change.outcome != "unreachable":
                log.info(
                    "reload %s@%s: %s %s -> %s",
                    change.model,
                    change.alias,
                    change.outcome,
                    change.old_version,
                    change.new_version,
                )


class Upkeep:
    """A pipeline's background work on its hot set (contract above)."""

    def __init__(self, hotset: HotSet, backoff: Backoff) -> None:
        self._hotset = hotset
        self._backoff = backoff
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False
        self.ready = False

    def start(self, reload: Callable[[], Awaitable[list[ReloadChange]]], poll_s: float) -> None:
        """After the hot set's first load: note readiness, retry what failed behind, poll every ``poll_s``
        (never when 0)."""
        if self._closed:  # closed while the first load ran
            return
        self.ready = not self._hotset.missing_defaults()
        self.keep_loading()
        if poll_s > 0:
            self._spawn(poll_reload(reload, poll_s), "hotset-poll")

    def keep_loading(self) -> None:
        """Start the loading loop when something is left to load and none runs."""
        retrying = self._closed or any(t.get_name() == "hotset-retry" and not t.done() for t in self._tasks)
        if not retrying and self._hotset.unloaded_models():
            self._spawn(load_unloaded(self._hotset, self._backoff, self.note_loaded), "hotset-retry")

    def note_loaded(self) -> None:
        """Ready once every default alias has loaded."""
        self.ready = self.ready or not self._hotset.missing_defaults()

    def reloaded(self) -> None:
        """After a reload: note readiness, and retry behind a version moved in that failed to load (as one at
        start is)."""
        self.note_loaded()
        self.keep_loading()

    async def close(self) -> None:
        """Cancel the loops and wait for them to end; none starts after."""
        self._closed = True
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def _spawn(self, work: Coroutine[Any, Any, None], name: str) -> None:
        task = asyncio.get_running_loop().create_task(work, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
