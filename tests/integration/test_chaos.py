"""The short chaos run in ``make test`` (the long one is ``make chaos``): at least ten kills of
the manager, agents and jobs at random points while jobs migrate, and nothing lost."""

from __future__ import annotations

from pathlib import Path

import pytest
from chaos_run import ChaosConfig, run_chaos

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.timeout(600)]


async def test_chaos_short_run_loses_nothing(tmp_path: Path) -> None:
    cfg = ChaosConfig(seed=7, migrations=8, min_faults=10, max_seconds=400.0)
    report = await run_chaos(tmp_path, cfg)
    print(report.summary())
    assert not report.problems, report.summary()
    assert report.kills >= 10
    assert report.migrations["done"] + report.migrations["rolled_back"] >= 8
    assert report.max_copies == 1
    assert report.recoveries >= report.faults["kill-manager"] + report.faults["kill-agent"]
