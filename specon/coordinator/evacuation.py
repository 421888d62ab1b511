"""Reclaim notices and cordons as drains (SPEC §6.6): pure rules, applied by ``Draining``.

A worker whose heartbeat carries a taint of ``recovery.evacuate_taints`` (a cloud's or an
autoscaler's notice that the node goes soon) is drained at once, each job saved within
``recovery.evacuate_deadline`` of the notice; with ``recovery.evacuate_cordoned``, a cordoned
worker (``node.kubernetes.io/unschedulable``, which Kubernetes implies for a cordoned node)
is drained with no deadline. Once the taint is gone, the cordon it put is lifted; an
operator's drain (``specon drain``) stays until ``specon uncordon``, though a notice still
gives it a deadline.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from specon.config import RecoveryConfig
from specon.coordinator.migration import Cordon
from specon.coordinator.state import WorkerRecord
from specon.model import TAINT_UNSCHEDULABLE, WorkerId
from specon.policy.placement import split_taint


def notice(taints: Iterable[str], cfg: RecoveryConfig) -> str | None:
    """The taint key in ``taints`` that calls for a drain: a reclaim notice before a cordon."""
    keys = {split_taint(t)[0] for t in taints}
    for key in cfg.evacuate_taints:
        if key in keys:
            return key
    return TAINT_UNSCHEDULABLE if cfg.evacuate_cordoned and TAINT_UNSCHEDULABLE in keys else None


@dataclass(frozen=True, slots=True)
class Evacuations:
    """Cordons to put (new, or an old one with a notice's deadline now) and workers to let go."""

    put: list[Cordon] = field(default_factory=list)
    lift: list[WorkerId] = field(default_factory=list)


def evacuations(
    workers: Iterable[WorkerRecord], cordons: Mapping[WorkerId, Cordon], cfg: RecoveryConfig, now: float
) -> Evacuations:
    out = Evacuations()
    for w in workers:
        c = cordons.get(w.id)
        key = notice(w.taints, cfg) if w.taints else None
        if key is None:
            if c is not None and c.taint is not None:
                out.lift.append(w.id)
            continue
        deadline = None if key == TAINT_UNSCHEDULABLE else now + cfg.evacuate_deadline
        if c is None:
            out.put.append(Cordon(w.id, now, deadline, taint=key))
        elif c.deadline is None and deadline is not None:  # a notice on a drained worker
            out.put.append(Cordon(w.id, c.since, deadline, taint=c.taint and key))
    return out
