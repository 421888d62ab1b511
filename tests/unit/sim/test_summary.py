"""The one table of every policy on every scenario, and the default's target check."""

from __future__ import annotations

import pytest

from specon.sim.experiment import run_scenario
from specon.sim.scenarios import scenario
from specon.sim.summary import table, target_misses
from specon.sim.trace import load_traces


@pytest.mark.slow
def test_the_summary_has_a_row_per_policy_a_column_per_scenario_and_the_paper_and_targets() -> None:
    traces = load_traces()
    results = [
        run_scenario(scenario(name), traces, policies=("ds", "specon", "balancer"), seeds=1)
        for name in ("A1", "A3")
    ]
    lines = table(results)
    header = next(line for line in lines if line.startswith("| policy"))
    assert header == "| policy | A1 | A3 |"
    rows = {line.split(" | ")[0] for line in lines if line.startswith("| ")}
    assert {"| **specon** (default)", "| balancer", "| *paper: SpeCon*", "| *target (default)*"} <= rows
    assert "| *paper: SpeCon* | -14.7 % / -5.6 % | -13.6 % / -24.7 % |" in lines
    # The check names each shortfall in words; the balancer's row is compared with the default's.
    for miss in target_misses(results):
        assert miss.startswith(("A1:", "A3:"))
