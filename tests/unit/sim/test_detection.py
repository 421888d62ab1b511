"""The convergence-detection benchmark: ground truth, ticks, diverging curves, ranking — and the
shipped classifier's behaviour on the committed recorded traces."""

from __future__ import annotations

import dataclasses
import itertools
import math

import pytest

from specon.config import MonitorConfig, default_policy
from specon.sim import detection
from specon.sim.detection import (
    Curve,
    Detection,
    diverge,
    diverging_set,
    ground_truth_index,
    ground_truth_step,
    request_tick,
    smooth,
    summarise,
    truth_tick,
)
from specon.sim.trace import Trace, load_traces

# E halves its distance to 1 every record: with Δ = one record and max-normalisation the
# specon classifier's G falls 2^-(m+1) per tick, below alpha = 0.01 from tick 6 on: WC at
# 6, CC at 7, request at 8.
GEOMETRIC = Trace(
    model="g", steps=400, step_cost=0.5, losses=tuple(1 + 2.0**-i for i in range(40)), source="", stride=10
)
FLAT = Trace(model="f", steps=400, step_cost=0.5, losses=(3.0,) * 40, source="", stride=10)
SPECON = MonitorConfig(classifier="specon", alpha=0.01)
TRACES = [t for model in sorted(load_traces()) for t in load_traces()[model]]


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
    # 5 % of the final improvement (10) is 0.5: reached once 10 - 0.1 i < 0.5.
    assert ground_truth_index(losses, half_width=0) == 96
    assert ground_truth_index(losses, half_width=0, fraction=0.5) == 51


def test_ground_truth_is_the_best_so_far_within_5_percent_of_the_final_improvement() -> None:
    # A late rise does not count: the best so far stays at 1.
    assert ground_truth_index([5.0, 4.0, 3.0, 2.0, 1.0, 1.5, 2.0], half_width=0) == 4
    # A dip that a later, lower loss beats: the best so far is within 5 % only at the end.
    assert ground_truth_index([10.0, 2.0, 6.0, 6.0, 0.0], half_width=0) == 4


def test_ground_truth_of_a_curve_that_never_improves() -> None:
    assert ground_truth_index([1.0, 1.0, 2.0], half_width=0) == 0
    assert ground_truth_step(FLAT) == FLAT.stride
    with pytest.raises(ValueError):
        ground_truth_index([], half_width=0)


def test_ground_truth_step_counts_steps() -> None:
    # half width 50 steps = 5 records; index 7 is the first within 5 % of the floor.
    assert ground_truth_step(GEOMETRIC) == 80


def test_ticks_known_answer() -> None:
    curve = Curve.of(GEOMETRIC)
    # A job of 40 ticks over 400 steps: one record per tick. The truth (step 80) is 7 ticks
    # after the first record (step 10); specon asks at tick 8.
    assert truth_tick(curve, 40) == 7
    assert request_tick(curve, SPECON, 40) == 8
    d = detection.detect(curve, SPECON, 40)
    assert (d.late, d.failed) == (1, False)
    assert request_tick(Curve.of(FLAT), SPECON, 40) is None


@pytest.mark.parametrize(
    ("truth", "asked", "late", "failed"),
    [(5, 7, 2, False), (5, 8, 3, True), (5, 4, -1, False), (5, 3, -2, True), (5, None, None, True)],
)
def test_a_detection_fails_outside_two_late_one_early(
    truth: int, asked: int | None, late: int | None, failed: bool
) -> None:
    d = Detection("m", 20, truth, asked)
    assert (d.late, d.failed) == (late, failed)


def test_any_request_on_a_diverging_curve_fails() -> None:
    assert Detection("m", 20, None, 3).failed and not Detection("m", 20, None, None).failed


def test_summarise_counts_each_failure_once() -> None:
    s = summarise(
        [
            Detection("m", 10, 5, 6),  # +1
            Detection("m", 10, 5, 9),  # +4, too late
            Detection("m", 10, 5, 2),  # -3, early
            Detection("m", 10, 5, None),  # missed
            Detection("m", 10, None, 4),  # diverging, asked
            Detection("m", 10, None, None),  # diverging, quiet
        ]
    )
    assert (s.curves, s.median_late, s.max_late, s.min_late) == (6, 1, 4, -3)
    assert (s.early, s.too_late, s.missed, s.diverging, s.diverging_requested) == (1, 1, 1, 2, 1)
    assert (s.failures, s.met) == (4, False)
    assert summarise([]).median_late is None


def test_diverge_grows_after_the_onset_and_nan_kind_blows_up() -> None:
    trace = Trace(model="m", steps=100, step_cost=1.0, losses=(1.0,) * 20, source="", stride=5)
    up = diverge(trace, onset=50, rate=0.1, kind="explode")
    assert up[:10] == (1.0,) * 10 and up[10] == pytest.approx(math.exp(0.5))
    assert all(b > a for a, b in itertools.pairwise(up[9:]))
    nan = diverge(trace, onset=50, rate=0.1, kind="nan")
    first = next(i for i, v in enumerate(nan) if math.isnan(v))
    assert nan[first - 1] <= detection.NAN_AFTER < math.exp(0.1 * ((first + 1) * 5 - 50))
    assert all(math.isnan(v) for v in nan[first:])
    with pytest.raises(ValueError):
        diverge(trace, onset=50, rate=0.1, kind="sideways")
    with pytest.raises(ValueError):
        diverge(trace, onset=50, rate=0.0, kind="nan")


def test_diverging_curves_turn_up_in_the_steep_fall_and_are_seeded() -> None:
    curves = diverging_set(TRACES, seed=7)
    assert len(curves) == len(TRACES) * len(detection.DIVERGE_KINDS)
    assert [c.losses for c in curves] == [c.losses for c in diverging_set(TRACES, seed=7)]
    assert [c.losses for c in curves] != [c.losses for c in diverging_set(TRACES, seed=8)]
    for c in curves:
        assert c.diverging and truth_tick(c, 20) is None
        finite = [v for v in c.losses if math.isfinite(v)]
        assert max(finite[len(finite) // 2 :]) > 2 * min(finite)  # it does blow up


def test_candidates_include_the_shipped_default_and_rank_by_failures() -> None:
    cands = detection.candidates()
    labels = [c.label for c in cands]
    assert len(labels) == len(set(labels))
    assert sum(c.monitor == MonitorConfig() for c in cands) == 1
    ok = summarise([Detection("m", 10, 5, 6)] * 4)
    bad = summarise([Detection("m", 10, 5, 9)] * 4)
    asks_on_diverging = summarise([Detection("m", 10, 5, 6), Detection("m", 10, None, 3)])
    assert (
        detection.rank_key(ok, ok) < detection.rank_key(bad, ok) < detection.rank_key(asks_on_diverging, ok)
    )
    assert detection.best({"ok": (ok, ok), "bad": (bad, ok), "div": (asks_on_diverging, ok)}) == "ok"


# --- the shipped default on the committed recordings (real PyTorch training) ----------------


@pytest.mark.slow
def test_the_shipped_default_never_asks_to_move_a_diverging_job() -> None:
    # The benchmark's seeds and seeds it never saw.
    for seed in (7, 8, 9, 1, 1234):
        s = summarise(detection.run(diverging_set(TRACES, seed=seed), MonitorConfig()))
        assert (s.diverging, s.diverging_requested) == (len(TRACES) * 2 * 3, 0)


def test_the_shipped_default_on_the_recorded_traces() -> None:
    """Measured by ``python -m bench bench_detection``. Short of the issue's target (every curve
    within 2 ticks late / 1 early): the ground truth of some recordings sits on a long tail
    within 4-6 % of the final improvement, where no causal detector can tell; this pins what
    the shipped default does reach, so a change that loses it shows."""
    runs = detection.run([Curve.of(t) for t in TRACES], MonitorConfig())
    total = summarise(runs)
    assert total.missed == 0
    assert total.failures <= 15  # of 45 curves x job lengths
    for model, s in detection.by_model(runs).items():
        assert s.median_late is not None and -1 <= s.median_late <= 2, model
    assert detection.by_model(runs)["vae"].met
    # The previous default (specon, alpha 0.01) misses curves and is far later.
    before = summarise(detection.run([Curve.of(t) for t in TRACES], SPECON))
    assert before.missed > 0 and before.failures > 2 * total.failures


def test_jobs_that_declare_their_steps_are_detected_closer_to_the_truth() -> None:
    """``bench_detection``'s declared-steps figures: the classifier told each tick's horizon
    (total / done) is outside the target less often than the doubling test without it, and
    still never asks on a diverging curve."""
    curves = [Curve.of(t) for t in TRACES]
    declared = summarise(detection.run(curves, MonitorConfig(), declared=True))
    undeclared = summarise(detection.run(curves, MonitorConfig()))
    assert declared.missed == 0
    assert declared.failures <= 12 < undeclared.failures  # of 45 curves x job lengths
    for seed in (7, 1234):
        s = summarise(detection.run(diverging_set(TRACES, seed=seed), MonitorConfig(), declared=True))
        assert s.diverging_requested == 0
    cands = detection.horizon_candidates()
    assert [c.monitor.robust.horizon_gain for c in cands] == list(detection.HORIZON_GAINS)
    assert sum(c.monitor == MonitorConfig() for c in cands) == 1


def test_paper_mode_is_still_algorithm_1_at_alpha_001() -> None:
    paper = default_policy("paper").monitor
    curve = Curve.of(GEOMETRIC)
    assert (paper.classifier, paper.alpha) == ("specon", 0.01)
    assert request_tick(curve, paper, 40) == request_tick(
        curve, dataclasses.replace(SPECON, normalize="none", aggregate="last", stale="zero"), 40
    )
