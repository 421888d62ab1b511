"""The policies ``specon demo --policy NAME`` runs live, on the demo's clock.

Each is the demo policy (``specon/data/demo-policy.yaml``: the defaults with Δ, heartbeats
and timeouts scaled to jobs of minutes) with the changes that make it that policy, the
same as the simulator's (``specon.sim.policies``):

* ``ds`` — no specon daemons at all (round-robin placement, never moves, equal shares);
* ``specon`` — the shipped defaults; ``specon-paper`` — paper mode;
* ``balancer`` — convergence-blind: no requests, no priority, while the most and least
  loaded workers differ by 2 or more jobs move the most recently placed job;
* ``fsp``, ``srpt``, ``optimus``, ``tiresias``, ``hermes``, ``slaq`` — DS's placement and no
  moves, with the rule's CPU weights on each worker (the agents apply them).
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any

from specon.config import (
    Policy,
    PriorityRule,
    load_policy,
    peer_priority,
    policy_from_dict,
    policy_to_dict,
)
from specon.wire import codec

DEMO_POLICY = Path(str(resources.files("specon") / "data" / "demo-policy.yaml"))

# Never enough active neighbours: Algorithm 1 classifies but never asks to move.
_NO_REQUESTS = {"request_min_active": 1 << 30}
_PEERS: tuple[PriorityRule, ...] = ("fsp", "srpt", "optimus", "tiresias", "hermes", "slaq")

CHANGES: dict[str, dict[str, Any]] = {
    "specon": {},
    "specon-paper": {"mode": "paper"},
    "balancer": {
        "monitor": _NO_REQUESTS,
        "priority": {"rule": "none"},
        "placement": {"require_gain": False},
        "migration": {"min_residence": 0.0},
        "rebalance": {
            "mode": "balanced",
            "when": "always",
            "duration_from": "placed",
            "max_rebalances_per_container": 1 << 30,
        },
    },
    **{
        rule: {
            "monitor": _NO_REQUESTS,
            "priority": codec.to_data(peer_priority(rule)),
            "rebalance": {"mode": "off"},
        }
        for rule in _PEERS
    },
}
# Names that run without any daemon.
WITHOUT_DAEMONS = ("ds",)
NAMES = (*WITHOUT_DAEMONS, *CHANGES)


def live_policy(name: str, *, base: Path = DEMO_POLICY) -> Policy:
    """The policy ``name`` runs with (``ValueError`` for an unknown name or for ``ds``)."""
    if name not in CHANGES:
        raise ValueError(f"unknown live policy {name!r} (known: {', '.join(NAMES)})")
    data = policy_to_dict(load_policy(base))
    change = CHANGES[name]
    if change.get("mode") == "paper":
        # Paper mode starts from the paper's values: keep only the demo's clock from the base.
        data = {k: data[k] for k in ("apiVersion", "kind")} | {
            "monitor": {"interval": data["monitor"]["interval"]},
            "messaging": data["messaging"],
            "migration": {"grace_period": data["migration"]["grace_period"]},
        }
    for key, value in change.items():
        if isinstance(value, dict):
            data.setdefault(key, {}).update(value)
        else:
            data[key] = value
    return policy_from_dict(data, source=f"live policy {name}")
