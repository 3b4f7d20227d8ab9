"""The driver lease against a fake name registry: who holds it, taking it again, and pinning it to a node."""

from __future__ import annotations

import pytest

from examlops.bootstrap.ray_lease import LEASE, Lease, lease_options
from examlops.core.errors import AlreadyRunning


class FakeNames:
    """Ray's named actors, reduced to the lease's name: who holds it, and taking it when it is free."""

    def __init__(self) -> None:
        self.holder: str | None = None
        self.taken = 0
        self.unreachable = False
        self.blind = 0  # lookups left that answer "nobody" while the name is taken (Ray's lookup failing)

    def take(self) -> str:
        if self.holder is not None:
            raise ValueError(f"The name {LEASE} (namespace=examlops) is already taken")
        self.taken += 1
        self.holder = f"actor-{self.taken}"
        return self.holder

    def lookup(self) -> str | None:
        if self.unreachable:
            raise ConnectionError("the GCS did not answer")
        if self.blind > 0:
            self.blind -= 1
            return None
        return self.holder


def lease(names: FakeNames) -> Lease:
    return Lease(names.take, holder=names.lookup, ident=str, where="the Ray cluster at ray-head:6379")


def test_a_lease_held_by_a_live_driver_is_refused_and_only_its_holder_holds_it() -> None:
    names = FakeNames()
    first, second = lease(names), lease(names)
    assert not first.held()
    first.take()
    with pytest.raises(AlreadyRunning, match=r"ray-head:6379 \(it holds the actor examlops-driver\)"):
        second.take()
    assert first.held() and not second.held()


def test_a_lease_whose_actor_died_is_taken_again_and_one_another_driver_took_is_given_up() -> None:
    names = FakeNames()
    ours = lease(names)
    ours.take()
    names.holder = None  # its actor died (its node, say): the name is free
    assert ours.keep() and ours.held() and names.taken == 2

    names.holder = "another-driver"
    assert not ours.keep()
    assert not ours.held()


def test_a_lease_that_cannot_be_checked_is_kept_but_never_counts_as_held() -> None:
    names = FakeNames()
    ours = lease(names)
    ours.take()
    names.unreachable = True
    assert ours.keep()  # serving goes on; checked again next time
    assert not ours.held()  # but nothing is deleted in doubt
    assert names.taken == 1


def test_the_lease_actor_is_pinned_to_the_drivers_node_with_no_fallback() -> None:
    pytest.importorskip("ray", reason="the Ray engine needs the ray extra (pip install 'examlops[ray]')")
    options = lease_options("a" * 56)
    strategy = options["scheduling_strategy"]
    assert (options["name"], options["namespace"]) == (LEASE, "examlops")
    assert (strategy.node_id, strategy.soft) == ("a" * 56, False)


def test_a_lease_whose_holder_reads_as_nobody_once_while_its_name_is_ours_is_kept() -> None:
    names = FakeNames()
    ours = lease(names)
    ours.take()
    names.blind = 1  # the lookup fails once; taking the name again fails, as our actor still holds it
    assert ours.keep()
    assert ours.held() and ours.keep() and names.taken == 1  # still ours, and no second actor
    assert ours._handle == "actor-1"  # the handle that keeps our actor alive was never dropped


def test_a_lease_whose_holder_cannot_be_read_twice_is_kept_in_doubt() -> None:
    names = FakeNames()
    ours = lease(names)
    ours.take()
    names.blind = 2  # our actor holds the name, yet the lookup says nobody both times
    assert ours.keep()
    assert ours._handle == "actor-1" and ours.held()
