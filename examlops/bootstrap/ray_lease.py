"""The driver lease on a joined Ray cluster: one examlops driver per cluster, and only its holder deletes.

The lease is a named actor, ``examlops-driver`` in the namespace ``examlops`` (``DriverLease``), created by
the driver that serves: not detached, so Ray ends it with that driver, crashed or not; pinned to the
driver's node (``NodeAffinitySchedulingStrategy``, ``soft=False``), so that it cannot die with another
node while its driver still serves and let a second driver in beside it.

``Lease.take`` creates it (``AlreadyRunning`` when a live driver holds it). ``held`` asks Ray who holds the
name now: this driver's actor, or not (it died, or another driver took the name since). ``keep`` is the
driver's periodic check: True while held, or once taken again when the name is free; False only when Ray
names another actor as the holder (that driver's applications are then not this one's to delete). A name
that is taken while the lookup said free (Ray's lookup fails with the same error as an absent name) is
looked up again, and kept in doubt: the handle is never dropped then, as that would let Ray end our actor.

``take``, ``holder`` and ``ident`` stand for Ray (``take_lease``, ``lease_holder``, ``actor_ident``); tests
pass their own. Imports ray only inside the functions that call it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from examlops.core.errors import AlreadyRunning

log = logging.getLogger(__name__)

LEASE = "examlops-driver"
NAMESPACE = "examlops"


class DriverLease:
    """The lease's actor: it holds nothing; that it runs says a driver does."""

    def held(self) -> bool:
        return True


def lease_options(node: str) -> dict[str, Any]:
    """The lease actor's Ray options: its name, and pinned to ``node`` (the driver's) with no fallback."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return {
        "name": LEASE,
        "namespace": NAMESPACE,
        "num_cpus": 0,
        "scheduling_strategy": NodeAffinitySchedulingStrategy(node, soft=False),
    }


def take_lease(node: str) -> Any:
    """The lease's actor on ``node``, owned by this driver; ``ValueError`` (Ray's ``ActorAlreadyExistsError``)
    when the name is taken."""
    import ray

    return ray.remote(DriverLease).options(**lease_options(node)).remote()


def lease_holder() -> str | None:
    """The id of the actor that holds the lease's name now; None when none does."""
    import ray

    try:
        return actor_ident(ray.get_actor(LEASE, namespace=NAMESPACE))
    except ValueError:  # no live actor by that name
        return None


def actor_ident(handle: Any) -> str:
    return str(handle._actor_id.hex())  # Ray's handles expose their id only under this name


class Lease:
    """This driver's hold on the cluster (contract above)."""

    def __init__(
        self,
        take: Callable[[], Any],
        *,
        holder: Callable[[], str | None] = lease_holder,
        ident: Callable[[Any], str] = actor_ident,
        where: str = "the Ray cluster",
    ) -> None:
        self._take, self._holder, self._ident, self._where = take, holder, ident, where
        self._handle: Any = None  # kept: dropping the last handle would let Ray end the actor
        self._id: str | None = None

    def take(self) -> None:
        """Hold the lease; ``AlreadyRunning`` when a live driver holds it."""
        try:
            self._handle = self._take()
        except ValueError as exc:
            raise AlreadyRunning(
                f"another examlops driver serves on {self._where} (it holds the actor {LEASE}): run one "
                "examlops driver per cluster (stop the other first)"
            ) from exc
        self._id = self._ident(self._handle)

    def held(self) -> bool:
        """Whether the lease's name is this driver's actor now (False on any doubt: then nothing is deleted)."""
        return self._check() is True

    def keep(self) -> bool:
        """True while held (or Ray cannot say now), or once taken again when its actor died and the name is
        free; False when Ray names another actor as the holder."""
        if self._check() in (True, None):
            return True
        try:
            self.take()
        except AlreadyRunning:
            return self._taken_meanwhile()
        except Exception as exc:  # Ray unreachable for now: checked again next time
            log.error("could not take the driver lease %s again: %s", LEASE, exc)
            return True
        log.warning("the driver lease %s was lost (its actor died) and is taken again", LEASE)
        return True

    def _taken_meanwhile(self) -> bool:
        """The name is taken though the check said it was not ours: False only when another actor holds it."""
        try:
            holder = self._holder()
        except Exception as exc:
            log.error("could not check the driver lease %s: %s", LEASE, exc)
            return True
        if holder is not None and holder != self._id:
            log.error("another examlops driver took the lease %s on %s", LEASE, self._where)
            return False
        log.warning("the driver lease %s is taken, its holder read as %s: kept, checked again", LEASE, holder)
        return True

    def _check(self) -> bool | None:
        """True: this driver holds the lease; False: it does not; None: Ray could not say."""
        if self._id is None:
            return False
        try:
            return self._holder() == self._id
        except Exception as exc:
            log.error("could not check the driver lease %s: %s", LEASE, exc)
            return None
