"""``dl2``: the learned priority (DL2's policy network, ``specon.policy.dl2``).

Rule: a small network scores each job from what the agent knows of it (remaining work,
fraction trained, CPU used against its fair share, Algorithm 1's gain, all relative to the
worker's other jobs); the highest score runs first (ranked weights, as ``srpt``). With
``min_share`` above 0, a job left with under that share of its fair CPU goes before all (a
starvation guard the network cannot override; off by default: in the simulator it cost
average JCT and did not lower the slowest job's slowdown). The weights are the ones shipped
in the package (trained by ``specon learn`` on the default training set) unless ``weights``
names a file ``specon learn`` wrote, read once per version of the file. Ties go to the job
that started first.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from specon.model import ContainerId
from specon.policy.dl2.explore import active
from specon.policy.dl2.features import features
from specon.policy.dl2.network import Network, WeightsError, load
from specon.policy.plugin import Rule
from specon.policy.priority.base import RATIO_DOC, JobProgress, ranked_weights, ratio_problems


@dataclass(frozen=True, slots=True)
class Args:
    weights: str = field(
        default="",
        metadata={"doc": "weights file written by `specon learn` (empty: the weights shipped with specon)"},
    )
    ratio: float = field(default=100.0, metadata={"doc": RATIO_DOC})
    min_share: float = field(
        default=0.0,
        metadata={
            "doc": "a job that has had less than this share of its fair CPU runs first, the most "
            "starved first, whatever the network says (0: never)"
        },
    )


def problems(args: Args) -> list[str]:
    out = ratio_problems(args.ratio)
    if not (0.0 <= args.min_share <= 1.0):
        out.append(f"min_share: must be in [0, 1], got {args.min_share}")
    if args.weights:
        try:
            load(args.weights)
        except WeightsError as err:
            out.append(f"weights: {err}")
    return out


def greedy(jobs: Sequence[JobProgress], scores: np.ndarray) -> list[int]:
    """Indices of ``jobs`` by score, highest first; ties to the job that started first, then
    to the first in ``jobs``."""
    started = np.fromiter((j.started for j in jobs), dtype=np.float64, count=len(jobs))
    return np.lexsort((started, -scores)).tolist()  # type: ignore[no-any-return]


def guarded(jobs: Sequence[JobProgress], picked: Sequence[int], min_share: float) -> list[ContainerId]:
    """``picked`` (indices into ``jobs``) with the starved jobs moved first: those whose CPU
    is under ``min_share`` of their fair share, least share first. The network learns to
    shorten the average; this bounds what any one job can lose to it (as Tiresias's
    starvation limit does), on every worker the network has not seen."""
    if min_share <= 0:
        return [jobs[i].id for i in picked]
    place = {i: k for k, i in enumerate(picked)}
    share = {i: jobs[i].cpu_seconds / jobs[i].fair_seconds for i in picked if jobs[i].fair_seconds > 0}
    starved = sorted((i for i, s in share.items() if s < min_share), key=lambda i: (share[i], place[i]))
    first = set(starved)
    return [jobs[i].id for i in (*starved, *(i for i in picked if i not in first))]


def order(jobs: Sequence[JobProgress], net: Network, min_share: float = 0.0) -> list[ContainerId]:
    """``jobs`` in the order ``net`` runs them (starved ones first: ``guarded``)."""
    return guarded(jobs, greedy(jobs, net.scores(features(jobs))), min_share)


def weights(jobs: Sequence[JobProgress], args: Args) -> dict[ContainerId, int]:
    if not jobs:
        return {}
    explorer = active()
    if explorer is None:
        ids = order(jobs, load(args.weights), args.min_share)
    else:  # the trainer's (``specon.sim.dl2``)
        ids = guarded(jobs, explorer.decide(jobs, features(jobs)), args.min_share)
    return ranked_weights(ids, args.ratio)


RULE = Rule(
    name="dl2",
    summary="learned order (DL2's policy network; `specon learn`)",
    doc="dl2: a learned order of the jobs, DL2's policy network trained by `specon learn`",
    args=Args,
    problems=problems,
    weights=weights,
    rank=80,
    # Its experiment is the default with this order (``specon.policy.experiments``), not a
    # peer without moves: it learns from the default and is compared with it.
    peer=False,
)
