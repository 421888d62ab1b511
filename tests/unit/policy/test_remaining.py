"""Steps left predicted from the loss curve (Optimus's fit) and the fairness bound on them."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from specon.policy import remaining
from specon.policy.remaining import ATTAINED_BOUND, Fit, bounded, refit, steps_left


def test_the_bound_caps_the_steps_left_at_a_multiple_of_the_steps_done() -> None:
    assert bounded(1900.0, 1000.0) == 900.0  # within the bound: the fit's own
    assert bounded(1e9, 100.0) == ATTAINED_BOUND * 100.0
    assert bounded(500.0, 800.0) == 0.0  # past the predicted convergence
    assert bounded(1e9, 0.0) == 0.0  # a job that has done nothing is bounded by nothing done
    assert Fit(10, 1e9).steps_left(50.0) == ATTAINED_BOUND * 50.0
    assert Fit(10, None).steps_left(50.0) is None  # no fit: unknown, as before


@given(
    st.floats(min_value=0.0, max_value=1e12, allow_nan=False),
    st.floats(min_value=0.0, max_value=1e9, allow_nan=False),
)
def test_a_prediction_is_never_above_the_bound_nor_below_zero(converge_at: float, step: float) -> None:
    left = bounded(converge_at, step)
    assert 0.0 <= left <= ATTAINED_BOUND * step
    assert left == min(max(0.0, converge_at - step), ATTAINED_BOUND * step)


def test_early_in_its_steep_fall_a_curve_is_predicted_far_and_the_bound_holds_it() -> None:
    # 1/(0.001 k + 1) + 0.5: within 5 % of its floor at k = 19 / 0.001 = 19,000 steps.
    steps = [float(k) for k in range(10, 210, 10)]
    losses = [1.0 / (0.001 * k + 1.0) + 0.5 for k in steps]
    k = remaining.steps_to_converge(steps, losses)
    assert k == pytest.approx(19_000, rel=0.01)
    assert steps_left(steps, losses) == ATTAINED_BOUND * 200.0
    fit = refit(Fit(), len(steps), lambda: (steps, losses))
    assert fit.converge_at == pytest.approx(k)
    assert fit.steps_left(200.0) == ATTAINED_BOUND * 200.0


def test_a_curve_is_fitted_from_its_third_point() -> None:
    # As many points as Optimus's curve has parameters: 1/(0.01 k + 1) + 0.5, k* = 1900.
    steps = [10.0, 20.0, 30.0]
    losses = [1.0 / (0.01 * k + 1.0) + 0.5 for k in steps]
    assert remaining.MIN_POINTS == 3
    assert remaining.steps_to_converge(steps[:2], losses[:2]) is None
    assert remaining.steps_to_converge(steps, losses) == pytest.approx(1900.0, rel=0.01)
    assert remaining.steps_to_converge(steps, [1.0, 1.1, 1.2]) is None  # a rising curve: no fit
