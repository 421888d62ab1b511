"""Fixtures shared by the unit tests."""

from __future__ import annotations

import pytest

from tests.unit.manager_fakes import FakeClock


@pytest.fixture
def clock() -> FakeClock:
    """The manager's clock, moved by hand (``manager_fakes.FakeClock``)."""
    return FakeClock()
