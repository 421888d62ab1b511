"""The replay engine: record times, tick boundaries, requests and counters."""

from __future__ import annotations

import math

import pytest

from specon.config import MonitorConfig
from specon.model import Category
from specon.policy.replay import record_times, replay

PC, WC, CC, DV = Category.PROGRESSING, Category.WATCHING, Category.CONVERGED, Category.DIVERGING
LAST = MonitorConfig(classifier="specon", aggregate="last", normalize="none", alpha=0.5)


def test_timestamps_are_relative_to_the_first_record() -> None:
    assert record_times([(1000.0, 1.0), (1012.5, 2.0)], seconds_per_record=7.0) == [(0.0, 1.0), (12.5, 2.0)]


def test_records_without_timestamps_follow_the_previous_one() -> None:
    got = record_times([(None, 1.0), (None, 2.0), (None, 3.0)], seconds_per_record=4.0)
    assert got == [(0.0, 1.0), (4.0, 2.0), (8.0, 3.0)]


def test_mixed_records_anchor_the_first_timestamp_after_the_untimed_ones() -> None:
    got = record_times([(None, 1.0), (500.0, 2.0), (None, 3.0), (510.0, 4.0)], seconds_per_record=2.0)
    assert [t for t, _ in got] == [0.0, 2.0, 4.0, 12.0]


def test_a_timestamp_going_backwards_keeps_the_previous_time() -> None:
    got = record_times([(100.0, 1.0), (90.0, 2.0), (130.0, 3.0)], seconds_per_record=1.0)
    assert [t for t, _ in got] == [0.0, 0.0, 30.0]


def test_a_tick_consumes_the_records_up_to_and_including_its_time() -> None:
    # t = 0 -> tick 0; t = 30 -> tick 1 (the boundary belongs to the earlier tick);
    # t = 30.5 -> tick 2, the last tick (the first at or after the last record).
    r = replay([(0.0, 1.0), (30.0, 2.0), (30.5, 3.0)], LAST)
    assert r.ticks == 3 and r.end == 60.0
    assert r.state.last_e == 3.0 and r.records == 3 and r.stale_ticks == 0
    assert replay([(0.0, 1.0), (30.0, 2.0)], LAST).ticks == 2


def test_gaps_are_stale_ticks() -> None:
    r = replay([(0.0, 1.0), (95.0, 2.0)], LAST)  # ticks at 0, 30, 60, 90, 120
    assert (r.ticks, r.stale_ticks) == (5, 3)


def test_a_gap_of_stale_ticks_shows_stalled_and_back() -> None:
    cfg = MonitorConfig(stale_ticks=2)
    r = replay([(0.0, 1.0), (30.0, 0.9), (150.0, 0.8)], cfg)
    assert [(t.t, t.source, t.target) for t in r.transitions] == [
        (90.0, PC, Category.STALLED),
        (150.0, Category.STALLED, PC),
    ]


def test_transitions_request_and_final() -> None:
    # E: 0, 4, 4.25, 4.375, 4.4375 (G 4, .25, .125, .0625): PC, PC, WC, CC, CC + request.
    values = [0.0, 4.0, 4.25, 4.375, 4.4375]
    r = replay([(30.0 * i, v) for i, v in enumerate(values)], LAST)
    assert [(t.t, t.source, t.target) for t in r.transitions] == [(60.0, PC, WC), (90.0, WC, CC)]
    assert (r.request_at, r.requests, r.final) == (120.0, 1, CC)
    # Still pending on the next slowing tick: one request, not two.
    r = replay([(30.0 * i, v) for i, v in enumerate([*values, 4.46875])], LAST)
    assert (r.request_at, r.requests) == (120.0, 1)


def test_a_reset_lets_a_job_request_again_but_request_at_is_the_first() -> None:
    values = [0.0, 4.0, 4.25, 4.375, 4.4375, 8.0, 8.25, 8.375, 8.4375, 8.46875]
    r = replay([(30.0 * i, v) for i, v in enumerate(values)], LAST)
    assert (r.request_at, r.requests) == (120.0, 2)
    assert (150.0, CC, PC) in [(t.t, t.source, t.target) for t in r.transitions]


def test_non_finite_values_are_counted_kept_out_of_e_and_shown_to_robust() -> None:
    records = [(0.0, 1.0), (30.0, math.nan), (30.0, 0.9), (60.0, math.inf)]
    r = replay(records, LAST)
    assert (r.records, r.nonfinite) == (2, 2)
    assert [v for _, v in r.points] == [1.0, 0.9]
    robust = replay(records, MonitorConfig(classifier="robust"))
    assert robust.final is DV and robust.request_at is None


def test_no_records_means_no_ticks() -> None:
    r = replay([], LAST)
    assert (r.ticks, r.records, r.final, r.transitions, r.request_at) == (0, 0, PC, (), None)


def test_bad_arguments_are_clear_errors() -> None:
    with pytest.raises(ValueError, match="limit"):
        replay([(0.0, 1.0), (1e12, 2.0)], LAST)
    with pytest.raises(ValueError, match="interval"):
        replay([(0.0, 1.0)], MonitorConfig(interval=0.0))
    with pytest.raises(ValueError, match="seconds per record"):
        replay([(None, 1.0)], LAST, seconds_per_record=-1.0)
    for length in (0.0, -5.0, math.nan, math.inf):
        with pytest.raises(ValueError, match="length"):
            replay([(0.0, 1.0)], LAST, length=length)


def test_a_declared_length_tells_the_classifier_its_horizon_each_tick() -> None:
    cfg = MonitorConfig(classifier="robust", interval=1.0)
    tail = [(float(t), 1.0 + 10.0 / (t + 1)) for t in range(40)]
    undeclared = replay(tail, cfg)  # the doubling test: as if twice its time so far were left
    soon = replay(tail, cfg, length=8.0)  # declared to end early: little is left to come
    long = replay(tail, cfg, length=3900.0)  # a hundred times longer: much is left
    assert soon.request_at is not None and undeclared.request_at is not None
    assert long.request_at is not None
    assert soon.request_at < undeclared.request_at < long.request_at
