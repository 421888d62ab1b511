"""The convergence-detection benchmark's logic: ground truth, replay, metrics, ranking."""

from __future__ import annotations

import pytest

from specon.sim import detection
from specon.sim.curves import CurveParams, fit_model, synthetic_set, synthetic_trace
from specon.sim.detection import (
    Detection,
    Score,
    by_family,
    detect,
    detector_grid,
    evaluate,
    ground_truth_index,
    ground_truth_step,
    make_detector,
    recommend,
    score,
    smooth,
)
from specon.sim.trace import Trace

# E halves its distance to 1 every record: with Δ = one record and max-normalisation G
# falls 2^-(m+1) per tick, below alpha = 0.01 from tick 6 on: WC at 6, CC at 7, request at 8.
GEOMETRIC = Trace(
    model="g", steps=400, step_cost=0.5, losses=tuple(1 + 2.0**-i for i in range(40)), source="", stride=10
)
FLAT = Trace(model="f", steps=400, step_cost=0.5, losses=(3.0,) * 40, source="", stride=10)
SPECON = make_detector("specon", alpha=0.01, tick_steps=10)


def test_smooth_is_a_centred_moving_average() -> None:
    values = [0.0, 3.0, 6.0, 9.0, 12.0, 6.0]
    assert smooth(values, 0) == values
    # start: the window shrinks symmetrically; end: it is cut off.
    assert smooth(values, 1) == [0.0, 3.0, 6.0, 9.0, 9.0, 9.0]
    assert smooth(values, 2) == [0.0, 3.0, 6.0, 7.2, 8.25, 9.0]
    with pytest.raises(ValueError):
        smooth(values, -1)


def test_ground_truth_on_a_linear_fall_then_plateau() -> None:
    losses = [10 - 0.1 * i for i in range(101)] + [0.0] * 50
    # 5 % of the total improvement (10) is 0.5: reached once 10 - 0.1 i < 0.5.
    assert ground_truth_index(losses, half_width=0) == 96
    assert ground_truth_index(losses, half_width=0, fraction=0.5) == 51


def test_ground_truth_ignores_a_late_rise() -> None:
    losses = [5.0, 4.0, 3.0, 2.0, 1.0, 1.5, 2.0]
    assert ground_truth_index(losses, half_width=0) == 4


def test_ground_truth_of_a_curve_that_never_improves() -> None:
    assert ground_truth_index([1.0, 1.0, 2.0], half_width=0) == 0
    assert ground_truth_step(FLAT) == FLAT.stride
    with pytest.raises(ValueError):
        ground_truth_index([], half_width=0)


def test_ground_truth_step_counts_steps() -> None:
    # half width 50 steps = 5 records; index 7 is the first within 5 % of the floor.
    assert ground_truth_step(GEOMETRIC) == 80


def test_detect_known_answer() -> None:
    late = detect(GEOMETRIC, SPECON, truth_step=50)
    assert late.request_step == 90  # tick 8 after the first record at step 10
    assert (late.delay, late.early, late.missed) == (40, False, False)
    assert late.lateness == pytest.approx(40 / 400)
    early = detect(GEOMETRIC, SPECON, truth_step=100)
    assert (early.delay, early.early, early.lateness) == (-10, True, 0.0)
    assert detect(GEOMETRIC, SPECON).truth_step == ground_truth_step(GEOMETRIC)


def test_detect_flat_curve_is_a_miss() -> None:
    miss = detect(FLAT, SPECON)
    assert (miss.request_step, miss.delay, miss.missed, miss.early) == (None, None, True, False)
    assert miss.lateness == pytest.approx((400 - 10) / 400)


def test_higher_alpha_asks_no_later() -> None:
    steps = [
        detect(GEOMETRIC, make_detector("specon", alpha=a, tick_steps=10)).request_step for a in (0.005, 0.05)
    ]
    assert steps[0] is not None and steps[1] is not None
    assert steps[1] < steps[0]


def test_score_metrics() -> None:
    detections = [
        Detection("a", steps=100, step_cost=2.0, truth_step=50, request_step=60),  # +10
        Detection("a", steps=100, step_cost=2.0, truth_step=50, request_step=40),  # -10, early
        Detection("a", steps=100, step_cost=2.0, truth_step=50, request_step=80),  # +30
        Detection("a", steps=100, step_cost=2.0, truth_step=60, request_step=None),  # miss
    ]
    s = score(SPECON, detections)
    assert (s.curves, s.false_early, s.missed) == (4, 0.25, 0.25)
    assert s.mean_delay == pytest.approx(0.1)  # (10 - 10 + 30) / 3 steps of 100
    assert s.median_delay == pytest.approx(0.1)
    assert s.mean_delay_seconds == pytest.approx(10 * 2.0)
    assert s.mean_lateness == pytest.approx((0.1 + 0.0 + 0.3 + 0.4) / 4)
    assert (s.label, s.family, s.classifier, s.alpha, s.tick_steps) == (
        "specon a=0.01 max/mean D=10",
        "specon a=0.01 max/mean",
        "specon",
        0.01,
        10.0,
    )
    only_misses = score(SPECON, detections[3:])
    assert (only_misses.mean_delay, only_misses.median_delay, only_misses.mean_delay_seconds) == (
        None,
        None,
        None,
    )
    with pytest.raises(ValueError):
        score(SPECON, [])


def _score(label: str, lateness: float, early: float, family: str = "f") -> Score:
    return Score(label, family, "specon", 0.01, 10.0, 10, early, 0.0, lateness, None, None, None)


def test_recommend_least_lateness_within_the_false_early_bound() -> None:
    scores = [_score("fast but early", 0.01, 0.5), _score("ok", 0.10, 0.1), _score("slow", 0.30, 0.0)]
    assert recommend(scores) == scores[1]
    assert recommend(scores, max_false_early=0.0) == scores[2]
    assert recommend(scores, max_false_early=1.0) == scores[0]
    assert recommend([_score("x", 0.1, 0.5)]) is None


def test_by_family_takes_the_mean_lateness_and_the_worst_rates() -> None:
    (fam,) = by_family([_score("f D=1", 0.1, 0.0), _score("f D=2", 0.3, 0.2)])
    assert (fam.label, fam.mean_lateness, fam.false_early) == ("f", pytest.approx(0.2), 0.2)


def test_grid_covers_both_classifiers_and_paper_mode() -> None:
    grid = detector_grid()
    labels = [d.label for d in grid]
    assert len(labels) == len(set(labels))
    assert {d.monitor.classifier for d in grid} == {"specon", "robust"}
    assert {d.monitor.alpha for d in grid} == set(detection.ALPHAS)
    assert {d.tick_steps for d in grid} == set(detection.TICK_STEPS)
    paper = [d for d in grid if d.family.startswith("specon-paper")]
    assert {(d.monitor.normalize, d.monitor.aggregate) for d in paper} == {("none", "last")}
    with pytest.raises(ValueError):
        make_detector("nope", alpha=0.01, tick_steps=10)
    with pytest.raises(ValueError):
        make_detector("robust", alpha=0.01, tick_steps=10, robust="nope")


def test_evaluate_is_deterministic() -> None:
    params = CurveParams(beta0=1e-3, beta1=0.5, beta2=0.3)
    base = synthetic_trace(model="m", steps=1000, step_cost=0.01, params=params, noise=0.05, seed=1)
    curves = {"m": fit_model([base])}
    traces = synthetic_set(curves, 6, seed=5)
    grid = detector_grid(alphas=(0.01, 0.05), tick_steps=(50,))
    first = evaluate(traces, grid)
    assert first == evaluate(synthetic_set(curves, 6, seed=5), grid)
    assert [s.label for s in first] == [d.label for d in grid]
    assert all(s.curves == 6 for s in first)
