"""The policies ``specon demo --policy NAME`` runs live: the catalogue's
(``specon.policy.experiments``, the same the simulator runs), laid over the demo policy.

The demo policy (``specon/data/demo-policy.yaml``) is the shipped defaults with Δ,
heartbeats and timeouts scaled to jobs of minutes; each named policy is it with the changes
that make it that policy. Every policy of the catalogue runs live but ``specon-predicted``
(the demo's jobs always declare their steps) and ``specon-oracle`` (it detects convergence by
the ground truth, which only the simulator has); ``ds`` runs no daemons at all.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from specon.config import Policy, load_policy
from specon.policy.experiments import CATALOGUE

DEMO_POLICY = Path(str(resources.files("specon") / "data" / "demo-policy.yaml"))

NAMES = tuple(name for name, exp in CATALOGUE.items() if exp.live)
# The catalogue's policies only the simulator runs.
SIM_ONLY = tuple(name for name, exp in CATALOGUE.items() if not exp.live)
# Names that run without any daemon.
WITHOUT_DAEMONS = tuple(name for name in NAMES if not CATALOGUE[name].daemons)


def live_policy(name: str, *, base: Path = DEMO_POLICY) -> Policy:
    """The policy ``name``'s daemons run over the policy file ``base`` (``ValueError`` for an
    unknown name, or for ``ds``, which runs no daemons)."""
    if name not in NAMES:
        raise ValueError(f"unknown live policy {name!r} (known: {', '.join(NAMES)})")
    policy = CATALOGUE[name].policy(load_policy(base))
    if policy is None:
        raise ValueError(f"live policy {name!r} runs no daemons: it has no policy file")
    return policy
