"""Algorithm 1 (``classifier: specon``): one test per reading SPEC §2-§3 fixes."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specon.config import MonitorConfig
from specon.model import Category, ContainerId, Direction
from specon.policy import monitor
from specon.policy.classifier import classifier_for, tick_worker
from specon.policy.monitor import MonitorState

PC, WC, CC = Category.PROGRESSING, Category.WATCHING, Category.CONVERGED

# Absolute differences and binary-exact values keep the expected G exact.
ABS = MonitorConfig(classifier="specon", normalize="none", alpha=0.5, aggregate="last")
DELTA = 30.0


def run(values: Sequence[float | Sequence[float]], cfg: MonitorConfig = ABS) -> list[MonitorState]:
    """Tick a fresh container once per entry (a number, or the samples of that tick)."""
    state = monitor.initial()
    out = []
    for m, v in enumerate(values):
        samples = [v] if isinstance(v, int | float) else list(v)
        state = monitor.tick(state, samples, m * DELTA, cfg)
        out.append(state)
    return out


def cats(states: Sequence[MonitorState]) -> list[Category]:
    return [s.category for s in states]


# E: 0, 4 (G=4), 4.25 (G=.25), 4.375 (G=.125), 4.4375 (G=.0625): slowing after tick 1.
SLOWING = [0.0, 4.0, 4.25, 4.375, 4.4375]


def test_bootstrap_tick0_records_tick1_computes_g_and_neither_classifies() -> None:
    # Tiny changes from the start: only tick 2 may classify.
    states = run([1.0, 1.0, 1.0], replace(ABS, alpha=10.0))
    assert states[0].last_e == 1.0 and states[0].last_g is None
    assert states[1].last_g == 0.0
    assert cats(states[:2]) == [PC, PC]
    # Tick 2: G=0 < alpha but not < Gp=0 -> bouncing, stays.
    assert states[2].category is PC
    states = run([8.0, 4.0, 3.0])  # G 4 then 1 (>= alpha): no step before tick 2
    assert cats(states) == [PC, PC, PC]


def test_successive_slowing_ticks_go_pc_wc_cc_then_want_a_request() -> None:
    """Lines 10-12 are a typo for WC -> CC: not PC -> WC twice."""
    states = run(SLOWING)
    assert cats(states) == [PC, PC, WC, CC, CC]
    assert states[3].t_cc == 3 * DELTA
    assert [s.wants_request for s in states] == [False, False, False, False, True]


def test_branches_are_exclusive_one_step_per_tick() -> None:
    # Tick 2 slows from PC: it must stop at WC, not fall through to CC and a request.
    s = run(SLOWING[:3])[-1]
    assert s.category is WC and s.t_cc is None and not s.wants_request


def test_bouncing_tick_stays() -> None:
    # G: 4, .25 (WC), .25 again (not < Gp) -> stays WC.
    states = run([0.0, 4.0, 4.25, 4.5])
    assert cats(states) == [PC, PC, WC, WC]


def test_g_exactly_alpha_resets_to_pc_clearing_request_and_keeping_t_cc() -> None:
    states = run([*SLOWING, 4.9375])  # last G = 0.5 = alpha
    cc = monitor.raise_request(states[-2])
    assert cc.pending_request
    reset = monitor.tick(cc, [4.9375], 5 * DELTA, ABS)
    assert reset.category is PC
    assert not reset.pending_request and not reset.wants_request
    assert reset.t_cc == 3 * DELTA  # history for metrics


def test_stale_skip_changes_nothing_but_the_stale_counters() -> None:
    s = run(SLOWING[:3])[-1]
    stale = monitor.tick(s, [], 99.0, ABS)
    assert (stale.category, stale.last_e, stale.last_g) == (s.category, s.last_e, s.last_g)
    assert stale.stale_run == 1 and stale.ticks == s.ticks + 1
    # The next sample continues from the pre-stale E and G: WC -> CC.
    nxt = monitor.tick(stale, [4.375], 120.0, ABS)
    assert nxt.category is CC and nxt.stale_run == 0


def test_stale_zero_repeats_the_previous_e_so_g_is_zero() -> None:
    cfg = replace(ABS, stale="zero")
    s = run(SLOWING[:3], cfg)[-1]  # WC, Gp = .25
    stale = monitor.tick(s, [], 99.0, cfg)
    assert stale.last_g == 0.0 and stale.category is CC and stale.stale_run == 1
    # Before any E exists there is nothing to repeat.
    assert monitor.tick(monitor.initial(), [], 0.0, cfg).last_e is None


def test_stalled_after_stale_ticks_in_a_row_and_cleared_by_a_sample() -> None:
    cfg = replace(ABS, stale_ticks=3)
    s = run(SLOWING[:3], cfg)[-1]
    for i in range(3):
        assert not s.stalled, i
        s = monitor.tick(s, [], 100.0 + i, cfg)
    assert s.stalled and s.display is Category.STALLED
    assert s.category is WC  # the classification underneath survives
    back = monitor.tick(s, [4.375], 200.0, cfg)
    assert not back.stalled and back.display is CC


def test_stalled_also_counts_in_zero_mode() -> None:
    cfg = replace(ABS, stale="zero", stale_ticks=2)
    s = run([1.0], cfg)[-1]
    s = monitor.tick(monitor.tick(s, [], 1.0, cfg), [], 2.0, cfg)
    assert s.stalled


def test_migrated_container_is_frozen_in_cc_and_never_requests() -> None:
    s = monitor.mark_migrated(run(SLOWING[:3])[-1], 500.0)
    assert s.category is CC and s.migrated and s.t_migrated == 500.0
    assert s.t_cc == 500.0  # never stamped before: the mark is the convergence time
    big = monitor.tick(s, [1e6], 530.0, ABS)
    assert big is s
    # Carried across a restore, it stays frozen.
    restored = monitor.from_dict(json.loads(json.dumps(monitor.to_dict(s))))
    assert monitor.tick(restored, [-1e6], 560.0, ABS) == restored
    a, b = ContainerId("a"), ContainerId("b")
    res = tick_worker(
        {a: restored, b: monitor.initial()}, {a: [0.0], b: [1.0]}, 590.0, replace(ABS, request_min_active=0)
    )
    assert res.requests == () and not res.states[a].pending_request


def test_mark_migrated_keeps_an_earlier_t_cc_and_clears_the_request() -> None:
    cc = monitor.raise_request(run(SLOWING)[-1])
    s = monitor.mark_migrated(cc, 999.0)
    assert s.t_cc == 3 * DELTA and not s.pending_request


def _worker(active: int) -> tuple[dict[ContainerId, MonitorState], ContainerId]:
    """A worker with one container about to want a request and ``active`` progressing ones."""
    cc = run(SLOWING[:4])[-1]
    assert cc.category is CC
    states = {ContainerId("cc"): cc}
    for i in range(active):
        states[ContainerId(f"pc{i}")] = monitor.initial()
    return states, ContainerId("cc")


def _samples(states: dict[ContainerId, MonitorState], value: float) -> dict[ContainerId, list[float]]:
    return {cid: [value] for cid in states}


@pytest.mark.parametrize(
    ("min_active", "active", "requests"),
    [(1, 0, False), (1, 1, True), (2, 1, False), (2, 2, True), (0, 0, True)],
)
def test_request_rule_needs_min_active_pc_or_wc_on_the_worker(
    min_active: int, active: int, requests: bool
) -> None:
    """Default 1; paper mode 2 (|PC| + |WC| > 1)."""
    states, cid = _worker(active)
    res = tick_worker(states, _samples(states, 4.4375), 120.0, replace(ABS, request_min_active=min_active))
    assert res.states[cid].wants_request
    assert (res.requests == (cid,)) is requests
    assert res.states[cid].pending_request is requests


def test_converged_neighbours_do_not_count_as_active() -> None:
    states, cid = _worker(0)
    states[ContainerId("other")] = monitor.mark_migrated(monitor.initial(), 0.0)
    res = tick_worker(states, {cid: [4.4375]}, 120.0, ABS)
    assert res.requests == ()


def test_pending_request_repeats_as_one_request_until_answered() -> None:
    states, cid = _worker(1)
    e = 4.4375
    res = tick_worker(states, _samples(states, e), 120.0, ABS)
    assert res.requests == (cid,)
    # Keep slowing: still pending, never raised twice.
    for m, step in enumerate((0.03125, 0.015625), start=5):
        e += step
        res = tick_worker(dict(res.states), {cid: [e]}, m * DELTA, ABS)
        assert res.requests == () and res.states[cid].pending_request
        assert monitor.pending_requests(res.states) == (cid,)
    # The manager answers (no target, not marked): cleared; a later slowing tick asks again.
    answered = {**res.states, cid: monitor.answer_request(res.states[cid])}
    assert monitor.pending_requests(answered) == ()
    res = tick_worker(answered, {cid: [e + 0.0078125]}, 210.0, ABS)
    assert res.requests == (cid,)


def test_tick_worker_ticks_containers_without_samples_as_stale() -> None:
    states, _ = _worker(1)
    res = tick_worker(states, {}, 120.0, ABS)
    assert all(s.stale_run == 1 for s in res.states.values())


def test_tick_worker_rejects_samples_for_unknown_containers() -> None:
    with pytest.raises(ValueError, match="ghost"):
        tick_worker({}, {ContainerId("ghost"): [1.0]}, 0.0, ABS)


@pytest.mark.parametrize(
    ("normalize", "expected"),
    [
        # E: 4 -> 2 -> 3: |dE| = 1; max |E| seen = 4; |E(t_{m-1})| = 2.
        ("none", 1.0),
        ("max", 0.25),
        ("previous", 0.5),
    ],
)
def test_normalize_variants(normalize: str, expected: float) -> None:
    cfg = MonitorConfig(classifier="specon", normalize=normalize, aggregate="last")  # type: ignore[arg-type]
    assert run([4.0, 2.0, 3.0], cfg)[-1].last_g == pytest.approx(expected)


def test_normalize_max_includes_the_current_value_and_zero_divisors_fall_back() -> None:
    cfg = MonitorConfig(classifier="specon", normalize="max", aggregate="last")
    assert run([1.0, 4.0], cfg)[-1].last_g == pytest.approx(0.75)
    prev = MonitorConfig(classifier="specon", normalize="previous", aggregate="last")
    assert run([0.0, 0.5], prev)[-1].last_g == 0.5


@pytest.mark.parametrize(("aggregate", "expected"), [("mean", 2.0), ("last", 3.0)])
def test_aggregate_mean_vs_last(aggregate: str, expected: float) -> None:
    cfg = MonitorConfig(classifier="specon", aggregate=aggregate)  # type: ignore[arg-type]
    assert run([[1.0, 2.0, 3.0]], cfg)[-1].last_e == expected


def test_non_finite_samples_never_enter_e() -> None:
    s = run([[1.0, float("nan"), 3.0], [float("inf")]], MonitorConfig(classifier="specon", aggregate="mean"))
    assert s[0].last_e == 2.0
    assert s[1].last_e == 2.0 and s[1].stale_run == 1
    assert run([[1e308, 1e308]])[-1].last_e == pytest.approx(1e308)


def test_direction_is_irrelevant_to_specon() -> None:
    """G is an absolute difference: a rising accuracy slows down like a falling loss."""
    mirrored = [-v for v in SLOWING]
    assert cats(run(mirrored)) == cats(run(SLOWING))


def test_state_round_trips_through_json() -> None:
    s = monitor.raise_request(run(SLOWING)[-1])
    assert monitor.from_dict(json.loads(json.dumps(monitor.to_dict(s)))) == s


def test_from_dict_reports_every_error_at_once() -> None:
    bad = monitor.to_dict(monitor.initial()) | {"category": "stalled", "ticks": -1, "last_e": "x"}
    with pytest.raises(monitor.StateError) as err:
        monitor.from_dict(bad)
    msg = str(err.value)
    assert "category" in msg and "ticks" in msg and "last_e" in msg
    with pytest.raises(monitor.StateError, match="mapping"):
        monitor.from_dict([])  # type: ignore[arg-type]
    with pytest.raises(
        monitor.StateError, match=r"format: unsupported 2.*votes\[1\]: expected true or false"
    ):
        monitor.from_dict({"format": 2, "votes": [True, 1]})


# What the hand-written serialiser wrote before the codec (an agent's saved states file).
OLD_STATE = {
    "format": 1,
    "category": "converged",
    "direction": "maximize",
    "ticks": 12,
    "last_e": 0.25,
    "last_g": 0.001,
    "max_abs_e": 2.0,
    "stale_run": 0,
    "stalled": False,
    "t_cc": 1700.5,
    "wants_request": False,
    "pending_request": True,
    "migrated": False,
    "t_migrated": None,
    "smoothed": [0.3, 0.27, 0.25],
    "votes": [True, False, True],
}


def test_the_old_serialised_form_still_reads_and_is_what_to_dict_writes() -> None:
    s = monitor.from_dict(OLD_STATE)
    assert s == monitor.MonitorState(
        category=CC,
        direction=Direction.MAXIMIZE,
        ticks=12,
        last_e=0.25,
        last_g=0.001,
        max_abs_e=2.0,
        t_cc=1700.5,
        pending_request=True,
        smoothed=(0.3, 0.27, 0.25),
        votes=(True, False, True),
    )
    # The same keys in the same order, and the doubling test's fit (empty) after them.
    assert monitor.to_dict(s) == {**OLD_STATE, "fit": []}
    assert list(monitor.to_dict(s)) == [*OLD_STATE, "fit"]
    # Integers where floats belong, missing keys (defaults) and keys from a newer agent.
    assert monitor.from_dict({"last_e": 1, "max_abs_e": -3, "smoothed": [1], "newer": 1}) == (
        monitor.MonitorState(last_e=1.0, max_abs_e=3.0, smoothed=(1.0,))
    )


def test_classifier_for_dispatches_and_rejects_unknown_names() -> None:
    c = classifier_for(ABS)
    assert c.name == "specon"
    assert c.tick(c.initial(), [1.0], 0.0).last_e == 1.0
    with pytest.raises(ValueError, match="unknown classifier"):
        classifier_for(replace(ABS, classifier="nope"))  # type: ignore[arg-type]


_STEP = {(PC, WC), (WC, CC)}


@pytest.mark.slow
@settings(max_examples=200, deadline=None)
@given(
    ticks=st.lists(
        st.lists(st.floats(allow_nan=False, allow_infinity=False, width=32), max_size=3), max_size=40
    ),
    normalize=st.sampled_from(["max", "previous", "none"]),
    stale=st.sampled_from(["skip", "zero"]),
    alpha=st.sampled_from([0.001, 0.01, 0.1, 1.0]),
)
def test_at_most_one_category_step_per_tick(
    ticks: list[list[float]], normalize: str, stale: str, alpha: float
) -> None:
    cfg = MonitorConfig(classifier="specon", normalize=normalize, stale=stale, alpha=alpha)  # type: ignore[arg-type]
    state = monitor.initial()
    for m, samples in enumerate(ticks):
        new = monitor.tick(state, samples, float(m), cfg)
        a, b = state.category, new.category
        assert a == b or (a, b) in _STEP or b is PC, (a, b)
        if b is CC and a is not CC:
            assert new.t_cc == float(m)
        assert new.last_g is None or new.last_g >= 0.0
        state = new
