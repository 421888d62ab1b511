"""``classifier: robust``: the doubling test; the change test (smoothing, k-of-n hysteresis, the
trend test); ``diverging``."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specon.config import MonitorConfig
from specon.model import Category, ContainerId, Direction
from specon.policy import monitor, robust
from specon.policy.classifier import classifier_for, tick_worker
from specon.policy.monitor import MonitorState
from specon.policy.robust_config import RobustConfig

PC, WC, CC, DV = Category.PROGRESSING, Category.WATCHING, Category.CONVERGED, Category.DIVERGING

DEFAULT = MonitorConfig(classifier="robust")
CHANGE = replace(DEFAULT, robust=RobustConfig(test="change"))
# The change test with no smoothing and absolute differences, so votes and slopes are easy
# to follow.
PLAIN = MonitorConfig(
    classifier="robust",
    normalize="none",
    alpha=0.5,
    aggregate="last",
    robust=RobustConfig(smoothing=1.0, k=3, n=4, trend_window=6, diverge_threshold=0.05, test="change"),
)


def run(
    values: Sequence[float | Sequence[float]],
    cfg: MonitorConfig = PLAIN,
    *,
    direction: Direction = Direction.MINIMIZE,
    state: MonitorState | None = None,
) -> list[MonitorState]:
    s = state or monitor.initial(direction=direction)
    out = []
    tick = classifier_for(cfg).tick
    for m, v in enumerate(values):
        s = tick(s, [v] if isinstance(v, int | float) else list(v), m * 30.0)
        out.append(s)
    return out


def cats(states: Sequence[MonitorState]) -> list[Category]:
    return [s.category for s in states]


def test_a_step_needs_k_slow_votes_and_a_full_trend_window() -> None:
    states = run([5.0] * 8)
    # Votes from tick 1; k=3 slow by tick 3, but the trend window fills only at tick 5.
    assert cats(states) == [PC] * 5 + [WC, CC, CC]
    assert states[6].t_cc == 6 * 30.0
    assert [s.wants_request for s in states] == [False] * 7 + [True]


def test_fewer_than_k_fast_votes_do_not_reset() -> None:
    cc = run([5.0] * 7)[-1]
    assert cc.category is CC
    # One fast tick (G = .5 >= alpha) among slow ones: 1 of 4 fast, k = 3.
    after = run([4.5, 4.5, 4.5], state=cc)
    assert cats(after) == [CC, CC, CC]
    # Three fast ticks in a row reset.
    reset = run([4.0, 3.5, 3.0], state=cc)
    assert cats(reset) == [CC, CC, PC]


def test_a_single_spike_resets_specon_but_not_robust() -> None:
    """Loss 2.3 -> 1.0 plateau, then one 20 % spike: noise, not new progress."""
    values = [2.3, 1.6, 1.2, *(1.0 + 0.01 * 0.5**i for i in range(12))]
    spike = [1.2, 1.0, 1.0, 1.0]
    rob = run([*values, *spike], CHANGE)
    assert rob[len(values) - 1].category is CC
    assert cats(rob[len(values) :]) == [CC] * 4
    spec = run([*values, *spike], replace(CHANGE, classifier="specon"))
    assert spec[len(values) - 1].category is CC
    assert spec[len(values)].category is PC


def test_the_trend_test_blocks_a_step_while_the_window_still_falls_steeply() -> None:
    falling = [10.0, 8.0, 6.0, 4.0, 2.0, 1.9, 1.8, 1.7]
    one_vote = replace(PLAIN, robust=replace(PLAIN.robust, k=1, n=1))
    # The last votes are slow (|dE| = .1 < .5) but the fitted slope over 6 ticks is not.
    assert cats(run(falling, one_vote))[-3:] == [PC, PC, PC]
    short = replace(one_vote, robust=replace(one_vote.robust, trend_window=2))
    assert cats(run(falling, short))[-3:] == [WC, CC, CC]


@pytest.mark.parametrize(
    ("direction", "values", "diverges"),
    [
        (Direction.MINIMIZE, [1.0, 1.1, 1.2, 1.3, 1.4, 1.5, 1.6], True),
        (Direction.MINIMIZE, [1.6, 1.5, 1.4, 1.3, 1.2, 1.1, 1.0], False),
        (Direction.MAXIMIZE, [1.0, 1.1, 1.2, 1.3, 1.4, 1.5, 1.6], False),
        (Direction.MAXIMIZE, [1.6, 1.5, 1.4, 1.3, 1.2, 1.1, 1.0], True),
    ],
)
def test_diverging_is_direction_aware(direction: Direction, values: list[float], diverges: bool) -> None:
    assert (run(values, direction=direction)[-1].category is DV) is diverges


def test_diverging_needs_more_than_the_threshold() -> None:
    barely = [1.0, 1.008, 1.016, 1.024, 1.032, 1.04]  # 4 % over the window
    assert run(barely)[-1].category is not DV
    assert (
        run(barely, replace(PLAIN, robust=replace(PLAIN.robust, diverge_threshold=0.03)))[-1].category is DV
    )


def test_a_spike_that_faded_from_the_newest_value_is_not_divergence() -> None:
    states = run([1.0] * 5 + [1.5, 1.0])
    assert states[-2].category is DV  # the newest value is 50 % up
    # The fitted line still tilts up, but oldest -> newest no longer worsened.
    assert states[-1].category is PC


def test_non_finite_values_make_a_job_diverge_at_once_and_drop_its_request() -> None:
    cc = monitor.raise_request(run([5.0] * 8)[-1])
    assert cc.pending_request
    for samples in ([5.0], []):
        dv = robust.tick(cc, samples, 300.0, PLAIN, nonfinite=2)
        assert dv.category is DV and not dv.pending_request and not dv.wants_request
        assert dv.stale_run == 0  # a job logging NaN is not silent


def test_diverging_never_requests_and_recovers_to_progressing() -> None:
    dv = run([1.0, 1.1, 1.2, 1.3, 1.4, 1.5, 1.6])[-1]
    assert dv.category is DV
    # Flat again: it stays diverging while the rise is in the window, never wanting a
    # request, then starts over as progressing.
    states = run([1.6] * 12, state=dv)
    first_pc = next(i for i, s in enumerate(states) if s.category is not DV)
    assert first_pc > 0 and states[first_pc].category is PC
    assert not any(s.wants_request for s in states[:first_pc])
    # A stale tick does not end divergence.
    assert robust.tick(dv, [], 999.0, PLAIN).category is DV


def test_diverging_counts_as_active_for_its_neighbours_request() -> None:
    cc = run([5.0] * 7)[-1]
    dv = robust.tick(monitor.initial(), [1.0], 0.0, PLAIN, nonfinite=1)
    a, b = ContainerId("cc"), ContainerId("dv")
    res = tick_worker({a: cc, b: dv}, {a: [5.0]}, 240.0, PLAIN, nonfinite={b: 1})
    assert res.requests == (a,)
    assert res.states[b].category is DV and not res.states[b].pending_request


def test_stale_ticks_skip_or_repeat_the_previous_value() -> None:
    s = run([5.0, 5.0])[-1]
    skipped = robust.tick(s, [], 60.0, PLAIN)
    assert (skipped.smoothed, skipped.votes) == (s.smoothed, s.votes) and skipped.stale_run == 1
    zero = robust.tick(s, [], 60.0, replace(PLAIN, stale="zero"))
    assert len(zero.votes) == len(s.votes) + 1 and zero.last_g == 0.0


def test_migrated_is_frozen_for_robust_too() -> None:
    s = monitor.mark_migrated(run([5.0] * 3)[-1], 100.0)
    assert robust.tick(s, [1e9], 130.0, PLAIN, nonfinite=3) is s


def test_smoothing_damps_noise_into_a_smaller_g() -> None:
    noisy = [1.0, 1.2, 1.0, 1.2]
    raw = run(noisy, replace(PLAIN, alpha=0.01))[-1].last_g
    smooth = run(noisy, replace(PLAIN, alpha=0.01, robust=replace(PLAIN.robust, smoothing=0.3)))[-1].last_g
    assert raw is not None and smooth is not None and smooth < raw


def test_state_with_memory_round_trips_and_dispatches_by_config() -> None:
    clf = classifier_for(CHANGE)
    assert clf.name == "robust"
    s = clf.tick(clf.tick(clf.initial(direction=Direction.MAXIMIZE), [0.5], 0.0), [0.6], 30.0)
    assert s.smoothed and s.votes
    assert clf.from_dict(json.loads(json.dumps(clf.to_dict(s)))) == s


def test_slope_is_the_least_squares_slope() -> None:
    assert robust.slope([1.0, 3.0, 5.0, 7.0]) == pytest.approx(2.0)
    assert robust.slope([2.0, 0.0, 2.0, 0.0]) == pytest.approx(-0.4)
    assert robust.slope([3.0]) == 0.0


_STEP = {(PC, WC), (WC, CC)}


@pytest.mark.slow
@settings(max_examples=150, deadline=None)
@given(
    ticks=st.lists(
        st.tuples(
            st.lists(st.floats(allow_nan=False, allow_infinity=False, width=32), max_size=3),
            st.integers(0, 1),
        ),
        max_size=40,
    ),
    direction=st.sampled_from(list(Direction)),
    normalize=st.sampled_from(["max", "previous", "none"]),
)
def test_robust_moves_at_most_one_step_per_tick(
    ticks: list[tuple[list[float], int]], direction: Direction, normalize: str
) -> None:
    cfg = replace(CHANGE, normalize=normalize)  # type: ignore[arg-type]
    s = monitor.initial(direction=direction)
    for m, (samples, bad) in enumerate(ticks):
        new = robust.tick(s, samples, float(m), cfg, nonfinite=bad)
        a, b = s.category, new.category
        assert a == b or (a, b) in _STEP or b in (PC, DV), (a, b)
        if b is DV:
            assert not new.wants_request and not new.pending_request
        s = new


# --- the doubling test (the default) --------------------------------------------------------

FAR, NEAR, PASSING, CONFIRMED = robust.FAR, robust.NEAR, robust.PASSING, robust.CONFIRMED
HYPERBOLA = [1.0 + 10.0 / t for t in range(1, 30)]  # Optimus' tail: 1/(b0 k + b1) + b2


def stages(values: Sequence[float], rc: RobustConfig = DEFAULT.robust) -> list[int]:
    fit: tuple[float, ...] = ()
    out = []
    for y in values:
        fit, stage = robust.fit_tick(fit, y, rc)
        out.append(stage)
    return out


def test_the_log_time_fit_recovers_a_line_in_log_time_whatever_its_memory() -> None:
    for memory in (0.5, 5.0, 50.0):
        fit: tuple[float, ...] = ()
        for t in range(1, 12):
            fit, _ = robust.fit_tick(fit, 5.0 - 2.0 * math.log(t), RobustConfig(memory=memory))
        got = robust.trend(fit)
        assert got is not None
        level, per_doubling = got
        assert level == pytest.approx(5.0 - 2.0 * math.log(11))
        assert per_doubling == pytest.approx(2.0 * math.log(2.0))
    assert robust.trend(()) is None
    assert robust.trend(robust.fit_tick((), 1.0, DEFAULT.robust)[0]) is None  # one point


def test_a_hyperbolic_tail_watches_then_converges_and_requests_at_once() -> None:
    # Improvement so far 10 - 10/t; a doubling brings about 5/t to 7/t of it: below 11 % of
    # it from t = 10 (twice that from t = 6), with the newest E near the best.
    assert stages(HYPERBOLA)[:11] == [FAR] * 5 + [NEAR] * 4 + [CONFIRMED] * 2
    states = run(HYPERBOLA, DEFAULT)
    assert cats(states)[:11] == [PC] * 5 + [WC] * 4 + [CC] * 2
    assert states[9].t_cc == 9 * 30.0 and states[9].wants_request
    assert all(s.wants_request for s in states[9:])


def test_a_larger_gain_converges_no_later() -> None:
    firsts = [stages(HYPERBOLA, replace(DEFAULT.robust, gain=g)).index(CONFIRMED) for g in (0.05, 0.11, 0.2)]
    assert firsts == sorted(firsts, reverse=True) and firsts[0] > firsts[-1]


def test_the_test_is_blind_to_the_scale_and_offset_of_the_loss() -> None:
    assert stages([3.0 * y - 7.0 for y in HYPERBOLA]) == stages(HYPERBOLA)


def test_confirm_waits_for_a_share_of_the_ticks_so_far() -> None:
    once = stages(HYPERBOLA, replace(DEFAULT.robust, confirm=0.0)).index(CONFIRMED)
    half = stages(HYPERBOLA, replace(DEFAULT.robust, confirm=0.5))
    # At t ticks the test must have passed for t/2 ticks in a row.
    assert half.index(CONFIRMED) > once and half[once] == PASSING


def test_the_bottom_of_a_u_is_not_convergence() -> None:
    """A fall that turns into a rise looks flat to a line through its last ticks: the newest E
    more than RISE x gain of the improvement above the best (here 0.1 of 1.75) stops it."""
    u = [3.0, 2.0, 1.5, 1.3, 1.25, 1.35, 1.5, 1.7, 1.95, 2.3, 2.8, 3.4, 4.0]
    assert CONFIRMED not in stages(u) and PASSING not in stages(u)
    states = run(u, DEFAULT)
    assert not any(s.wants_request for s in states) and states[-1].category is DV


def test_a_job_that_never_improved_is_never_converged() -> None:
    assert set(stages([2.0] * 20)) == {FAR}
    assert set(stages([2.0 + 0.01 * t for t in range(20)])) == {FAR}


def test_maximize_mirrors_minimize() -> None:
    loss = run(HYPERBOLA, DEFAULT)
    accuracy = run([-y for y in HYPERBOLA], DEFAULT, direction=Direction.MAXIMIZE)
    assert cats(accuracy) == cats(loss)


def test_a_drop_in_the_loss_after_convergence_starts_over() -> None:
    cc = run(HYPERBOLA[:12], DEFAULT)[-1]
    assert cc.category is CC
    # A learning-rate drop: the loss falls steeply again, so the job progresses again.
    after = run([1.5, 1.0, 0.6, 0.4], DEFAULT, state=monitor.raise_request(cc))
    assert after[-1].category in (PC, WC) and not after[-1].pending_request


def test_the_fit_is_constant_size_and_stale_ticks_do_not_age_it() -> None:
    s = run([1.0 + 1.0 / t for t in range(1, 2000)], DEFAULT)[-1]
    assert len(s.fit) == len(run(HYPERBOLA[:3], DEFAULT)[-1].fit) and s.fit[0] == 1999.0
    assert robust.tick(s, [], 0.0, DEFAULT).fit == s.fit


def test_non_finite_values_break_the_run_of_passing_ticks() -> None:
    cc = run(HYPERBOLA[:12], DEFAULT)[-1]
    dv = robust.tick(cc, [], 400.0, DEFAULT, nonfinite=3)
    assert dv.category is DV and not dv.wants_request
    assert dv.fit[-1] == 0.0 and dv.fit[:-1] == cc.fit[:-1]


def test_a_fit_of_another_shape_starts_over() -> None:
    fresh, _ = robust.fit_tick((), 2.0, DEFAULT.robust)
    assert robust.fit_tick((5.0, 1.0, 2.0), 2.0, DEFAULT.robust)[0] == fresh


def test_the_doubling_state_round_trips() -> None:
    clf = classifier_for(DEFAULT)
    s = run(HYPERBOLA[:8], DEFAULT)[-1]
    assert s.fit and not s.votes  # only the change test votes
    assert clf.from_dict(json.loads(json.dumps(clf.to_dict(s)))) == s


# --- a declared length (the horizon) -------------------------------------------------------


def first_confirmed(values: Sequence[float], horizon: float | None) -> int | None:
    fit: tuple[float, ...] = ()
    for t, y in enumerate(values, start=1):
        fit, stage = robust.fit_tick(fit, y, DEFAULT.robust, horizon)
        if stage == CONFIRMED:
            return t
    return None


def test_a_declared_job_converges_when_the_rest_of_its_run_would_not_pay() -> None:
    tail = [1.0 + 10.0 / t for t in range(1, 60)]
    # At its declared end nothing is left to come: it passes as soon as the fit exists.
    assert first_confirmed(tail, 1.0) == robust.MIN_FIT_TICKS
    # The further its end, the later it converges: a fixed ``horizon`` (total / done) is a
    # job whose end keeps receding, so its curve must flatten further to pass.
    got = [first_confirmed(tail, h) for h in (1.0, 1.5, 2.0, 4.0, 10.0, 100.0)]
    assert all(a is not None for a in got)
    assert got == sorted(got) and len(set(got)) == len(got)
    # Without a declared length the doubling test decides (twice the training so far).
    assert first_confirmed(tail, None) == first_confirmed(tail, 2.0)


def test_what_a_tail_still_brings_is_its_slope_times_a_shrinking_share_of_the_time_left() -> None:
    q = robust.TAIL_EXPONENT
    for r in (1.0, 1.1, 2.0, 10.0, 1e6):
        # l = c + A t**-q falls from t to r t by A t**-q (1 - r**-q) = |slope| (1 - r**-q) / q.
        assert robust._tail_left(r) == pytest.approx((1.0 - r**-q) / q)
    assert robust._tail_left(1.0) == 0.0
    assert robust._tail_left(0.5) == 0.0  # a job past its declared steps has nothing left
    assert robust._tail_left(1e12) < 1.0 / q  # bounded: a tail at q never falls more


def test_a_declared_length_never_lets_a_rising_or_diverging_curve_request() -> None:
    falling = [1.0 + 10.0 / t for t in range(1, 12)]
    rising = [*falling, *(falling[-1] * 1.5**k for k in range(1, 10))]
    states = []
    s = monitor.initial()
    tick = classifier_for(DEFAULT).tick
    for m, y in enumerate(rising):
        s = tick(s, [y], m * 30.0, horizon=1.0)  # its declared end: nothing left to come
        states.append(s)
    assert states[-1].category is DV and not states[-1].pending_request
    assert not any(st.wants_request for st in states[len(falling) + 1 :])


def test_tick_worker_gives_each_container_its_own_horizon() -> None:
    tail = [1.0 + 10.0 / t for t in range(1, 8)]
    a, b = ContainerId("a"), ContainerId("b")
    states = {a: monitor.initial(), b: monitor.initial()}
    for m, y in enumerate(tail):
        result = tick_worker(states, {a: [y], b: [y]}, m * 30.0, DEFAULT, horizons={a: 1.0})
        states = dict(result.states)
    # a is at its declared end and converged; b (no horizon) still needs its doubling.
    assert states[a].category is CC
    assert states[b].category is not CC
    # The paper's classifier knows no horizon: the same states with or without one.
    paper = MonitorConfig()
    paper = replace(paper, classifier="specon")
    s1 = s2 = monitor.initial()
    for m, y in enumerate(tail):
        s1 = monitor.tick(s1, [y], m * 30.0, paper)
        s2 = monitor.tick(s2, [y], m * 30.0, paper, horizon=1.0)
    assert s1 == s2
