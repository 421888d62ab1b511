"""The status page's browser sessions: random ids, a bounded lifetime, a bounded count."""

from __future__ import annotations

import pytest
from specon_manager.auth import READER, SHARED, Identity
from specon_manager.sessions import MAX_ID_LENGTH, SessionStore, new_id

from tests.unit.manager_fakes import FakeClock

READ = Identity(READER, agent=False)
SHARE = Identity(SHARED)


def test_a_session_is_found_by_its_id_until_its_ttl_passes() -> None:
    clock = FakeClock()
    store = SessionStore(60.0, clock=clock)
    session, evicted = store.open(READ)
    assert evicted == 0 and session.identity == READ and session.expires == clock() + 60.0
    assert store.get(session.id) == session
    clock.advance(59.9)
    assert store.get(session.id) == session
    clock.advance(0.1)
    assert store.get(session.id) is None
    assert len(store) == 0


def test_ids_are_random_url_safe_and_never_the_same() -> None:
    store = SessionStore(60.0)
    ids = {store.open(READ)[0].id for _ in range(200)}
    assert len(ids) == 200
    for sid in ids:
        assert len(sid) == 43 and sid.isascii() and all(c.isalnum() or c in "-_" for c in sid)
    assert len(new_id()) <= MAX_ID_LENGTH


def test_closing_ends_a_session_and_says_whether_it_was_live() -> None:
    clock = FakeClock()
    store = SessionStore(10.0, clock=clock)
    a, _ = store.open(READ)
    b, _ = store.open(SHARE)
    assert store.close(a.id) is True
    assert store.get(a.id) is None and store.get(b.id) == b
    assert store.close(a.id) is False  # twice: nothing left to close
    clock.advance(10.0)
    assert store.close(b.id) is False  # expired: no longer live
    assert store.close("never-opened") is False


def test_past_capacity_the_oldest_session_is_evicted() -> None:
    clock = FakeClock()
    store = SessionStore(100.0, capacity=3, clock=clock)
    opened = []
    for _ in range(3):
        opened.append(store.open(READ)[0])
        clock.advance(1.0)
    fourth, evicted = store.open(SHARE)
    assert evicted == 1
    assert store.get(opened[0].id) is None
    assert [store.get(s.id) for s in opened[1:]] == opened[1:]
    assert store.get(fourth.id) == fourth and len(store) == 3


def test_expired_sessions_make_room_before_any_live_one_is_evicted() -> None:
    clock = FakeClock()
    store = SessionStore(5.0, capacity=2, clock=clock)
    store.open(READ)
    clock.advance(3.0)
    live, _ = store.open(READ)
    clock.advance(2.0)  # the first expired, the second has 3 s left
    _, evicted = store.open(READ)
    assert evicted == 0 and store.get(live.id) == live


def test_a_repeated_id_from_the_source_is_drawn_again() -> None:
    ids = iter(["same", "same", "other"])
    store = SessionStore(5.0, make_id=lambda: next(ids))
    assert store.open(READ)[0].id == "same"
    assert store.open(SHARE)[0].id == "other"


@pytest.mark.parametrize("sid", ["", "x" * (MAX_ID_LENGTH + 1), "\udcff", "a b"])
def test_an_odd_cookie_value_finds_nothing(sid: str) -> None:
    store = SessionStore(5.0)
    store.open(READ)
    assert store.get(sid) is None


@pytest.mark.parametrize(("ttl", "capacity"), [(0.0, 1), (-1.0, 1), (1.0, 0)])
def test_a_store_needs_a_positive_ttl_and_capacity(ttl: float, capacity: int) -> None:
    with pytest.raises(ValueError, match="ttl > 0 and capacity >= 1"):
        SessionStore(ttl, capacity=capacity)
