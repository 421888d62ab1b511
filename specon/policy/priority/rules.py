"""The weights a worker's jobs get under the policy's priority rule (each rule validates its
own arguments: ``specon.config`` calls its ``problems``)."""

from __future__ import annotations

from collections.abc import Sequence

from specon.config import PriorityConfig
from specon.model import WEIGHT_DEFAULT, ContainerId
from specon.policy.priority import fsp, hermes, optimus, slaq, srpt, tiresias
from specon.policy.priority.base import JobProgress

# Rules that read Algorithm 1's gain: their agents must classify even under a policy that
# never migrates.
NEEDS_GAIN = frozenset({"hermes", "slaq"})


def weights(jobs: Sequence[JobProgress], cfg: PriorityConfig) -> dict[ContainerId, int]:
    """Each job's CPU weight under ``cfg.rule`` (``none``: every job the default weight)."""
    rule = cfg.rule
    if rule == "fsp":
        return fsp.weights(jobs, cfg.fsp)
    if rule == "srpt":
        return srpt.weights(jobs, cfg.srpt)
    if rule == "optimus":
        return optimus.weights(jobs, cfg.optimus)
    if rule == "tiresias":
        return tiresias.weights(jobs, cfg.tiresias)
    if rule == "hermes":
        return hermes.weights(jobs, cfg.hermes)
    if rule == "slaq":
        return slaq.weights(jobs, cfg.slaq)
    return {j.id: WEIGHT_DEFAULT for j in jobs}
