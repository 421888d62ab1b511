"""One catalogue of named experiment policies: ``specon sim`` and ``specon demo`` run the
same policies (the same objects, over their own base), not only the same names."""

from __future__ import annotations

from pathlib import Path

import pytest

from specon.cli import cmd_demo, cmd_sim
from specon.config import default_policy, load_policy, parse_policy, policy_to_yaml
from specon.embedded import live_policies
from specon.policy import experiments
from specon.policy.experiments import CATALOGUE, moves
from specon.policy.priority.rules import NEEDS_GAIN, RULES
from specon.sim import policies as sim


def test_sim_and_demo_draw_their_names_from_the_catalogue() -> None:
    assert sim.SIMULATED == experiments.NAMES
    assert (*experiments.NAMES, "bound") == sim.POLICIES
    assert cmd_sim.POLICIES is sim.POLICIES
    assert tuple(name for name, exp in CATALOGUE.items() if exp.live) == live_policies.NAMES
    assert cmd_demo.NAMES is live_policies.NAMES
    assert live_policies.WITHOUT_DAEMONS == ("ds",)
    peers = [name for name, rule in RULES.items() if rule.weights is not None and rule.peer]
    assert "dl2" not in peers
    assert set(experiments.NAMES) == {
        "ds",
        "specon-paper",
        "specon",
        "specon-predicted",
        "specon-oracle",
        "dl2",
        "balancer",
        *peers,
    }
    # Live runs neither the jobs that declare no steps nor the ground truth's detection.
    assert set(experiments.NAMES) - set(live_policies.NAMES) == {"specon-predicted", "specon-oracle"}


def test_live_and_simulated_policies_are_the_same_policy_objects(tmp_path: Path) -> None:
    # The demo over the shipped defaults (instead of its own clock) runs exactly the
    # policies the simulator runs.
    shipped = tmp_path / "defaults.yaml"
    shipped.write_text(policy_to_yaml(default_policy()))
    for name in live_policies.NAMES:
        simulated = sim.make_policy(name)
        assert simulated.name == name
        if name in live_policies.WITHOUT_DAEMONS:
            assert simulated.daemons is None and simulated.manager is None
            continue
        assert live_policies.live_policy(name, base=shipped) == simulated.daemons, name
        # And over the demo's own file, the catalogue's policy laid over it.
        demo = load_policy(live_policies.DEMO_POLICY)
        assert live_policies.live_policy(name) == CATALOGUE[name].policy(demo), name


def test_the_balancer_is_one_policy_blind_to_convergence() -> None:
    live = live_policies.live_policy("balancer")
    simulated = sim.make_policy("balancer")
    assert simulated.manager is simulated.daemons is not None
    for policy in (live, simulated.manager):
        assert policy.rebalance.duration_from == "placed"  # the most recently placed job moves
        assert (policy.rebalance.mode, policy.rebalance.when) == ("balanced", "always")
        assert policy.priority.rule == "none" and not policy.placement.require_gain
        assert policy.monitor.request_min_active == experiments.NO_REQUESTS  # never asks


def test_the_simulator_skips_only_what_cannot_change_a_thing() -> None:
    for name, exp in CATALOGUE.items():
        simulated = sim.make_policy(name)
        assert (simulated.declared, simulated.oracle) == (exp.declared, exp.oracle)
        if simulated.daemons is None:
            assert not simulated.classify
            continue
        # No manager where the policy can move nothing; a classifier wherever it is read.
        assert (simulated.manager is not None) == moves(simulated.daemons)
        assert simulated.classify == (simulated.manager is not None or simulated.priority.rule in NEEDS_GAIN)
        assert simulated.priority == simulated.daemons.priority
    assert [n for n in CATALOGUE if sim.make_policy(n).manager is not None] == [
        "specon-paper",
        "specon",
        "specon-predicted",
        "specon-oracle",
        "dl2",
        "balancer",
    ]


def test_only_the_specon_policies_take_a_users_file_and_the_run_s_knobs() -> None:
    mine = parse_policy(policy_to_yaml(default_policy()).replace("alpha: 0.01", "alpha: 0.02"))
    assert mine.monitor.alpha == 0.02
    assert sim.make_policy("specon", base=mine).daemons == mine
    assert sim.make_policy("specon-predicted", base=mine).daemons == mine
    assert sim.make_policy("specon-oracle", base=mine).daemons == mine
    assert sim.make_policy("specon-paper", base=mine).daemons == default_policy("paper")
    assert sim.make_policy("balancer", base=mine).daemons == sim.make_policy("balancer").daemons
    # dl2 is the user's file with the learned order.
    learned = sim.make_policy("dl2", base=mine).daemons
    assert learned is not None and learned.monitor.alpha == 0.02 and learned.priority.rule == "dl2"
    tuned = sim.make_policy("specon-paper", alpha=0.05, interval=20.0).daemons
    assert tuned is not None
    assert (tuned.mode, tuned.monitor.alpha, tuned.monitor.interval) == ("paper", 0.05, 20.0)
    assert sim.make_policy("fsp", alpha=0.05).daemons == sim.make_policy("fsp").daemons


def test_unknown_names() -> None:
    with pytest.raises(ValueError, match="unknown policy 'nope'"):
        sim.make_policy("nope")
    with pytest.raises(ValueError, match="computed, not simulated"):
        sim.make_policy("bound")
    with pytest.raises(ValueError, match="unknown policy 'nope'"):
        experiments.experiment("nope")
