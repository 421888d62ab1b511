"""``classifier.horizon``: a job's declared steps over its steps done, as each tick sees it."""

from __future__ import annotations

import math

from specon.policy.classifier import horizon


def test_a_horizon_is_the_declared_steps_over_the_steps_done() -> None:
    assert horizon(1000, 250) == 4.0
    assert horizon(1000, 1000) == 1.0
    assert horizon(1000, 1500) == 1.0  # past its declared steps: nothing left


def test_no_horizon_without_a_declared_length_or_a_step() -> None:
    assert horizon(None, 10) is None
    assert horizon(1000, None) is None
    assert horizon(1000, 0) is None
    assert horizon(1000, -3) is None
    assert horizon(math.nan, 10) is None
    assert horizon(1000, math.inf) is None
