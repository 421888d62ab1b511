"""The discrete-event engine: order, cancellation, stopping."""

from __future__ import annotations

import math

import pytest

from specon.sim.engine import ARRIVE, COMPLETE, PASS, TICK, Engine


def test_events_run_in_time_then_priority_then_insertion_order() -> None:
    engine = Engine()
    seen: list[str] = []
    engine.at(5.0, lambda: seen.append("pass@5"), priority=PASS)
    engine.at(5.0, lambda: seen.append("tick@5"), priority=TICK)
    engine.at(5.0, lambda: seen.append("done@5 first"), priority=COMPLETE)
    engine.at(5.0, lambda: seen.append("done@5 second"), priority=COMPLETE)
    engine.at(1.0, lambda: seen.append("arrive@1"), priority=ARRIVE)
    engine.run()
    assert seen == ["arrive@1", "done@5 first", "done@5 second", "tick@5", "pass@5"]
    assert engine.now == 5.0
    assert engine.events == 5


def test_clock_is_the_event_time_inside_an_action_and_actions_can_schedule() -> None:
    engine = Engine()
    times: list[float] = []

    def first() -> None:
        times.append(engine.now)
        engine.after(2.5, lambda: times.append(engine.now))

    engine.at(1.0, first)
    engine.run()
    assert times == [1.0, 3.5]


def test_cancelled_events_do_not_run() -> None:
    engine = Engine()
    seen: list[int] = []
    h = engine.at(1.0, lambda: seen.append(1))
    engine.at(2.0, lambda: seen.append(2))
    h.cancel()
    assert engine.pending() == 1
    engine.run()
    assert seen == [2]


def test_run_stops_at_until_and_on_stop() -> None:
    engine = Engine()
    seen: list[int] = []
    for t in (1, 2, 3, 4):
        engine.at(float(t), lambda t=t: seen.append(t))  # type: ignore[misc]
    engine.run(until=2.0)
    assert seen == [1, 2]
    engine.run(stop=lambda: len(seen) >= 3)
    assert seen == [1, 2, 3]
    engine.run()
    assert seen == [1, 2, 3, 4]


def test_scheduling_in_the_past_or_at_infinity_is_an_error() -> None:
    engine = Engine(start=10.0)
    with pytest.raises(ValueError, match="past"):
        engine.at(9.0, lambda: None)
    with pytest.raises(ValueError, match="finite"):
        engine.at(math.inf, lambda: None)
