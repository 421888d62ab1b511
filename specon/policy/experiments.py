"""The named experiment policies: one catalogue for ``specon sim --policy NAME`` (and the
simulated benchmarks) and ``specon demo --policy NAME`` (and the live ones).

Each is a policy file: the changes that make it that policy, laid over a base policy, which
the caller gives. The simulator's base is the shipped defaults (``default_policy()``, or a
user's policy file for the policies marked ``replaceable``); the demo's is its own file, the
defaults on a clock of minutes (``specon.embedded.live_policies``). So a policy that runs
live is the very policy the simulator runs, on another clock; the simulator only skips the
work that cannot change a thing (``moves``: no manager where nothing can move):

* ``ds`` — no specon daemons at all: round-robin placement, never moves, equal shares;
* ``specon-paper`` — Algorithms 1-3 in paper mode (``mode: paper``; the base's clock only);
* ``specon`` — Algorithms 1-3 with the shipped defaults (the base itself);
* ``specon-predicted`` — ``specon`` on jobs that declare no total steps: their remaining
  work is predicted from the loss curve alone (``specon.policy.remaining``); simulator only,
  since the demo's jobs always declare their steps;
* ``specon-oracle`` — ``specon`` with perfect convergence detection: each job is called
  converged at its trace's true convergence point (``specon.sim.oracle``) instead of by the
  classifier; simulator only (live jobs have no ground truth), to measure what better
  detection could be worth;
* ``dl2`` — ``specon`` with the ``dl2`` priority rule: the order of each worker's jobs
  learned by ``specon learn`` (imitating ``specon``, then reinforcement learning);
* ``balancer`` — convergence-blind, descheduler-style: no requests, no priority, and while
  the most and least loaded workers differ by 2 or more jobs, the most recently placed job
  on a most-loaded worker moves to a least-loaded one (Algorithm 3's ``balanced`` mode with
  ``duration_from: placed``, every pass, no per-job limit, no residence time, no gain test);
* one peer per priority rule that sets weights (``specon.policy.priority.rules``), named
  after it: DS's placement and no moves, with the rule's CPU weights on each worker at its
  paper's arguments (``peer_priority``). Adding a rule adds its peer.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from specon.config import Policy, peer_priority, policy_from_dict, policy_to_dict
from specon.policy.plugin import Rule
from specon.policy.priority.rules import RULES
from specon.wire import codec

# A ``request_min_active`` no worker reaches: Algorithm 1 classifies, but no job ever asks
# to move (the peers' and the balancer's agents).
NO_REQUESTS = 1 << 30
# "No limit" on a job's moves (the field is an int).
UNLIMITED = 1 << 30
# The peers in the order of the published tables (bench_sim); the peers of other rules
# follow them, in the registry's order.
_PEER_ORDER = ("fsp", "optimus", "tiresias", "hermes", "slaq", "srpt")


@dataclass(frozen=True, slots=True)
class Experiment:
    """One named policy of the catalogue."""

    name: str
    doc: str
    # Sections of the policy file, each a mapping of the keys it changes; None: no specon
    # daemons at all (``ds``).
    changes: Mapping[str, Mapping[str, Any]] | None = field(default_factory=dict)
    # Starts from paper mode, keeping only the base's clock (Δ, messaging, grace period).
    paper: bool = False
    # Algorithm 1-2's knobs of a run apply (``specon sim --alpha/--interval/--weights``, the
    # Table III sweep): the specon policies.
    tuned: bool = False
    # A user's policy file stands in for the base (``specon sim --policy FILE``).
    replaceable: bool = False
    # Its jobs declare their total steps (else remaining work is predicted from the loss).
    declared: bool = True
    # Detection by the ground truth's convergence point instead of the classifier (only the
    # simulator knows it).
    oracle: bool = False

    @property
    def daemons(self) -> bool:
        """Whether it runs specon's agents and manager at all."""
        return self.changes is not None

    @property
    def live(self) -> bool:
        """Whether ``specon demo`` can run it (the demo's jobs always declare their steps;
        live jobs have no ground truth to detect convergence by)."""
        return self.declared and not self.oracle

    def policy(self, base: Policy) -> Policy | None:
        """The policy its daemons run, laid over ``base`` (None: it runs none); validated like
        a policy file (a ``PolicyError`` lists every problem)."""
        if self.changes is None:
            return None
        data = policy_to_dict(base)
        if self.paper:
            data = {
                "apiVersion": data["apiVersion"],
                "kind": data["kind"],
                "mode": "paper",
                "monitor": {"interval": data["monitor"]["interval"]},
                "messaging": data["messaging"],
                "migration": {"grace_period": data["migration"]["grace_period"]},
            }
        for key, value in self.changes.items():
            data[key] = {**data.get(key, {}), **value}
        return policy_from_dict(data, source=f"policy {self.name}")


def moves(policy: Policy) -> bool:
    """Whether ``policy`` can ever move a job: its agents ask (Algorithm 2) or its manager
    rebalances (Algorithm 3). Where it cannot, a manager would decide nothing."""
    return policy.monitor.request_min_active < NO_REQUESTS or policy.rebalance.mode != "off"


def _peer(rule: Rule[Any]) -> Experiment:
    return Experiment(
        rule.name,
        f"DS's placement, no moves, CPU weights by {rule.name} ({rule.summary})",
        {
            "monitor": {"request_min_active": NO_REQUESTS},
            "priority": codec.to_data(peer_priority(rule.name)),
            "rebalance": {"mode": "off"},
        },
    )


def _catalogue() -> Mapping[str, Experiment]:
    named = [
        Experiment("ds", "the default scheduler: round-robin placement, never moves", None),
        Experiment("specon-paper", "Algorithms 1-3 in paper mode", paper=True, tuned=True),
        Experiment("specon", "Algorithms 1-3 with the shipped defaults", tuned=True, replaceable=True),
        Experiment(
            "specon-predicted",
            "specon on jobs that declare no total steps (remaining work from the loss curve)",
            tuned=True,
            replaceable=True,
            declared=False,
        ),
        Experiment(
            "specon-oracle",
            "specon with perfect detection: converged at the trace's true convergence point",
            tuned=True,
            replaceable=True,
            oracle=True,
        ),
        Experiment(
            "dl2",
            "specon with the learned order of jobs on each worker (DL2's policy network)",
            {"priority": {"rule": "dl2"}},
            tuned=True,
            replaceable=True,
        ),
        Experiment(
            "balancer",
            "convergence-blind: while the most and least loaded workers differ by 2 or more "
            "jobs, move the most recently placed job",
            {
                "monitor": {"request_min_active": NO_REQUESTS},
                "priority": codec.to_data(peer_priority("none")),
                "placement": {"require_gain": False},
                "migration": {"min_residence": 0.0},
                "rebalance": {
                    "mode": "balanced",
                    "when": "always",
                    "duration_from": "placed",
                    "max_rebalances_per_container": UNLIMITED,
                },
            },
        ),
    ]
    weighing = [r for r in RULES.values() if r.weights is not None and r.peer]
    rank = {name: i for i, name in enumerate(_PEER_ORDER)}
    peers = sorted(weighing, key=lambda r: rank.get(r.name, len(rank)))  # stable: registry order
    out: dict[str, Experiment] = {}
    for exp in (*named, *map(_peer, peers)):
        if exp.name in out:
            raise ValueError(f"policy {exp.name!r} named twice (a priority rule named like a policy?)")
        out[exp.name] = exp
    return MappingProxyType(out)


CATALOGUE: Mapping[str, Experiment] = _catalogue()
NAMES: tuple[str, ...] = tuple(CATALOGUE)


def experiment(name: str) -> Experiment:
    """The named policy (``ValueError`` for an unknown name)."""
    try:
        return CATALOGUE[name]
    except KeyError:
        raise ValueError(f"unknown policy {name!r} (known: {', '.join(NAMES)})") from None
