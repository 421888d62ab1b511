"""Fixtures shared by the unit tests."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, settings

from tests.unit.manager_fakes import FakeClock

# Property tests must not fail by chance: no wall-clock deadline per example (200 ms by
# default, which a busy machine's stall exceeds) and no "too slow" health check. A test's
# own @settings still sets what it names.
settings.register_profile("specon", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("specon")


@pytest.fixture
def clock() -> FakeClock:
    """The manager's clock, moved by hand (``manager_fakes.FakeClock``)."""
    return FakeClock()
