"""Login sessions: idle expiry on an injected clock, a bound on how many are kept, CSRF comparison."""

from __future__ import annotations

from examlops.dashboard.sessions import SessionStore, consume_once, csrf_matches, issue_once


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_session_lives_while_used_and_ends_after_its_idle_ttl() -> None:
    clock = Clock()
    store = SessionStore(ttl_s=100.0, clock=clock)
    session_id, session = store.open("exa_token")
    clock.now = 90.0
    assert store.get(session_id) is session
    clock.now = 180.0  # 90 s after the last use
    assert store.get(session_id) is session
    clock.now = 281.0
    assert store.get(session_id) is None
    assert store.get(session_id) is None


def test_background_refreshes_do_not_renew_a_session_and_no_use_outlives_its_max_age() -> None:
    clock = Clock()
    store = SessionStore(ttl_s=100.0, max_age_s=250.0, clock=clock)
    idle, _ = store.open("a")
    for t in (50.0, 90.0):  # an open tab refreshing its figures, nobody at it
        clock.now = t
        assert store.get(idle, renew=False) is not None
    clock.now = 101.0
    assert store.get(idle, renew=False) is None
    used, _ = store.open("b")  # opened at 101
    for t in (180.0, 260.0, 340.0):
        clock.now = t
        assert store.get(used) is not None
    clock.now = 352.0  # used 12 s ago, but logged in 251 s ago
    assert store.get(used) is None


def test_a_one_time_token_confirms_its_own_action_once() -> None:
    store = SessionStore(clock=Clock())
    _, session = store.open("a")
    token = issue_once(session, "reload|JPCP|")
    assert not consume_once(session, token, "promote|JPCP|")  # another action: refused, and the token spent
    token = issue_once(session, "reload|JPCP|")
    assert consume_once(session, token, "reload|JPCP|") and not consume_once(session, token, "reload|JPCP|")
    assert not consume_once(session, None, "reload|JPCP|")


def test_the_oldest_session_goes_first_past_the_bound_and_logout_ends_one() -> None:
    store = SessionStore(max_sessions=2, clock=Clock())
    first, _ = store.open("a")
    second, _ = store.open("b")
    third, _ = store.open("c")
    assert store.get(first) is None and store.get(second) is not None
    store.close(third)
    assert store.get(third) is None


def test_csrf_must_match_the_sessions_own_token_and_the_token_never_shows_in_a_repr() -> None:
    store = SessionStore(clock=Clock())
    _, session = store.open("exa_secret_token")
    _, other = store.open("exa_other")
    assert csrf_matches(session, session.csrf)
    assert not csrf_matches(session, other.csrf) and not csrf_matches(session, None)
    assert "exa_secret_token" not in repr(session)
