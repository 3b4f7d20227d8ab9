"""The hot set's background upkeep: aliases that failed to load at start, and the reload poll.

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
from collections.abc import Awaitable, Callable

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
