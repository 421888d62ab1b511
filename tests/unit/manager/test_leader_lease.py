"""The election's decisions (``specon_manager.lease``) on a fake clock: expiry by the
candidate's own observation, release, renewal, transitions, the leader's own deadline."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from specon_manager.lease import (
    Acquire,
    Follow,
    Record,
    Renew,
    Seen,
    Timing,
    claimed,
    decide,
    holds,
    micro_time,
    observe,
    released,
)

T = Timing()  # 8 / 5 / 1 s


def test_the_defaults_replace_a_killed_leader_within_fifteen_seconds() -> None:
    assert T.problems() == []
    # Worst case: the standby saw the last renewal one retry late and tries one retry late.
    assert T.lease_duration + 2 * T.retry_period <= 10.0
    assert T.lease_duration - T.renew_deadline >= 2.0  # the fence's margin


@pytest.mark.parametrize(
    ("timing", "says"),
    [
        (Timing(5, 5, 1), "greater than the renew deadline"),
        (Timing(8, 1, 1), "1.2 x the retry period"),
        (Timing(8.5, 5, 1), "whole seconds"),
        (Timing(0, 5, 1), "must be > 0"),
        (Timing(8, 5, -1), "retry period must be > 0"),
    ],
)
def test_unusable_timings_are_named(timing: Timing, says: str) -> None:
    assert any(says in p for p in timing.problems()), timing.problems()


def test_no_lease_is_created() -> None:
    assert decide("a", None, 0.0) == Acquire(create=True)


def test_a_lease_expires_by_the_candidates_own_clock_from_when_it_last_changed() -> None:
    rec = Record("b", 8, renew_time="2000-01-01T00:00:00.000000Z")  # an old renewTime: never read
    seen = observe(None, rec, "1", now=100.0)
    follow = decide("a", seen, 107.9)
    assert isinstance(follow, Follow) and follow.holder == "b" and follow.expires_in == pytest.approx(0.1)
    # The same record read again does not restart the count; a renewal does.
    seen = observe(seen, rec, "1", now=105.0)
    assert decide("a", seen, 108.0) == Acquire()
    renewed = Record("b", 8, renew_time="2000-01-01T00:00:01.000000Z")
    seen = observe(seen, renewed, "2", now=108.0)
    assert isinstance(decide("a", seen, 108.0), Follow) and seen.since == 108.0


def test_a_released_lease_is_taken_at_once_and_ones_own_is_renewed() -> None:
    gone = released(Record("b", 8, transitions=3), wall=0.0)
    assert (gone.holder, gone.duration, gone.transitions) == ("", 1, 3)
    assert decide("a", observe(None, gone, "5", now=0.0), 0.0) == Acquire()
    assert decide("a", observe(None, Record("a", 8), "5", now=0.0), 0.0) == Renew()


def test_a_new_holder_counts_a_transition_a_renewal_keeps_acquire_time() -> None:
    first = claimed("a", None, T, wall=1_700_000_000.0)
    assert (first.holder, first.duration, first.transitions) == ("a", 8, 0)
    assert first.acquire_time == first.renew_time == "2023-11-14T22:13:20.000000Z"
    seen = Seen(first, "1", 0.0)
    again = claimed("a", seen, T, wall=1_700_000_001.5)
    assert again.acquire_time == first.acquire_time and again.renew_time == "2023-11-14T22:13:21.500000Z"
    assert again.transitions == 0
    taken = claimed("b", Seen(again, "2", 0.0), T, wall=1_700_000_010.0)
    assert (taken.holder, taken.transitions) == ("b", 1) and taken.acquire_time == taken.renew_time


def test_a_damaged_lease_reads_as_nobodys_and_round_trips_otherwise() -> None:
    rec = Record.of({"spec": {"holderIdentity": 7, "leaseDurationSeconds": "8", "leaseTransitions": True}})
    assert rec == Record()
    assert Record.of({"spec": None}) == Record() and Record.of({}) == Record()
    good = Record("a", 8, "2024-01-01T00:00:00.000000Z", "2024-01-01T00:00:01.000000Z", 2)
    assert Record.of({"spec": good.spec()}) == good


def test_the_leader_acts_only_within_its_renew_deadline() -> None:
    assert not holds(None, T, 0.0)
    assert holds(100.0, T, 104.9)
    assert not holds(100.0, T, 105.0)


@given(st.floats(min_value=0, max_value=4e9, allow_nan=False))
def test_micro_time_is_the_api_servers_format(wall: float) -> None:
    text = micro_time(wall)
    assert len(text) == 27 and text.endswith("Z") and text[10] == "T" and text[19] == "."
