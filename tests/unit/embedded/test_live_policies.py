"""The policies `specon demo --policy NAME` runs live, and the demo's own measures."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specon.cli.main import main
from specon.config import default_policy
from specon.embedded.demo import quality_time
from specon.embedded.live_policies import NAMES, WITHOUT_DAEMONS, live_policy
from specon.policy.experiments import CATALOGUE
from specon.policy.priority.rules import RULES


def test_every_live_policy_keeps_the_demo_clock_and_is_what_its_name_says() -> None:
    with_daemons = [name for name in NAMES if name not in WITHOUT_DAEMONS]
    for name in with_daemons:
        p = live_policy(name)
        assert (p.monitor.interval, p.messaging.heartbeat_interval) == (4.0, 1.0), name
    assert live_policy("specon").priority == default_policy().priority
    assert live_policy("specon").migration.min_residence == 8.0  # 60 s on the demo's clock
    paper = live_policy("specon-paper")
    assert (paper.mode, paper.rebalance.mode, paper.priority.rule) == ("paper", "paper", "none")
    balancer = live_policy("balancer")
    assert (balancer.priority.rule, balancer.rebalance.duration_from) == ("none", "placed")
    peers = [name for name, rule in RULES.items() if rule.weights is not None and rule.peer]
    for rule in peers:  # every rule's peer runs live
        peer = live_policy(rule)
        assert (peer.priority.rule, peer.rebalance.mode) == (rule, "off")
    # The learned rule's policy is the default with its order, moves and all.
    learned = live_policy("dl2")
    assert learned.priority.rule == "dl2"
    assert learned.rebalance == live_policy("specon").rebalance
    # Every policy of the catalogue runs live but the one whose jobs declare no steps and
    # the one that detects by the ground truth (live jobs have none).
    assert set(NAMES) == set(CATALOGUE) - {"specon-predicted", "specon-oracle"}
    assert {*peers, "ds", "specon", "specon-paper", "dl2", "balancer"} == set(NAMES)


@pytest.mark.slow
def test_an_unknown_policy_name_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--policy", "nope", "--out", str(tmp_path)]) == 2
    assert "neither a live policy" in capsys.readouterr().err
    with pytest.raises(ValueError, match="runs no daemons"):
        live_policy("ds")  # ds runs no daemons: it has no policy file
    with pytest.raises(ValueError, match="unknown live policy"):
        live_policy("specon-predicted")  # the demo's jobs always declare their steps


def test_time_to_quality_is_read_from_the_jobs_own_records(tmp_path: Path) -> None:
    log = tmp_path / "progress.jsonl"
    # The loss falls from 2 to 1 by record 10, then stays flat: 95 % of the improvement near
    # record 10, a few records later through the benchmark's smoothing (50 steps each side).
    lines = [json.dumps({"event": "started", "ts": 99.0})]
    for i in range(40):
        loss = 2.0 - min(i, 10) / 10
        lines.append(json.dumps({"step": 5 * (i + 1), "loss": loss, "ts": 100.0 + i}))
    lines.append("not json")
    log.write_text("\n".join(lines) + "\n")
    t = quality_time(log, log_every=5)
    assert t is not None and 105.0 <= t <= 120.0
    assert quality_time(tmp_path / "missing.jsonl", log_every=5) is None
