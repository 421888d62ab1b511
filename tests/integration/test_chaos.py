"""The short chaos run in ``make test`` (the long one is ``make chaos``): at least four kills of
the manager, agents and jobs, two lost hosts, a host reclaimed after a notice and a few
partitions (two of them longer than recovery.after) at random points while jobs migrate, on
network hosts with two agents' clocks minutes off, and nothing lost, no stale copy's write,
nothing left behind."""

from __future__ import annotations

from pathlib import Path

import pytest
from chaos_run import ChaosConfig, run_chaos

from specon.testing.net_hosts import available, leftovers

# The run bounds itself (faults for at most MAX_SECONDS, then FINISH_SECONDS for the last jobs)
# and reports what went wrong; the timeout only catches a hang, past those and the cluster's
# start and the judging (a full run here once spent 390 s in faults and was cut at 600 s before
# the run could say which jobs were lost).
MAX_SECONDS, FINISH_SECONDS = 400.0, 180.0
pytestmark = [
    pytest.mark.slow,
    pytest.mark.integration,
    pytest.mark.timeout(MAX_SECONDS + FINISH_SECONDS + 180),
]


async def test_chaos_short_run_loses_nothing(tmp_path: Path) -> None:
    cfg = ChaosConfig(
        seed=7,
        migrations=8,
        min_faults=4,  # kills: host losses and long partitions are drawn more often (6: 400 s)
        min_partitions=4,
        min_host_losses=2,
        min_long_partitions=2,
        min_reclaims=1,
        max_seconds=MAX_SECONDS,
        finish_seconds=FINISH_SECONDS,
    )
    report = await run_chaos(tmp_path, cfg)
    print(report.summary())
    assert not report.problems, report.summary()
    assert report.kills >= 4
    assert report.migrations["done"] + report.migrations["rolled_back"] >= 8
    # No copy wrote after a newer one started, and none ran nowhere past recovery + a restore.
    assert report.stale_commits == 0 and report.gaps_over_bound == 0, report.summary()
    assert report.recoveries >= report.faults["kill-manager"] + report.faults["kill-agent"]
    # Hosts were lost with their jobs, and those jobs were restored elsewhere.
    assert report.faults["host-loss"] >= 2 and report.restored["recovered"] + report.restored["crashed"] >= 1
    # A host was reclaimed after a notice; what its jobs lost is judged with every other job's.
    assert report.faults["reclaim"] >= 1
    if available() is None:  # network hosts here: partitions happened, and nothing is left
        assert report.partitions >= 4 and report.long_partitions >= 2 and report.hosts_tag
        assert leftovers(report.hosts_tag) == []
        # Two agents' clocks were off, or the notes say why they could not be.
        assert report.skews == {"w1": 300.0, "w2": -420.0} or any("clocks" in n for n in report.notes)
