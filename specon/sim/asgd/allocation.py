"""Node allocation across async-SGD jobs (MB-ASGD Section IV; pure: jobs in, nodes out).

A job's remaining service time on ``w`` nodes is ``S(w) = J * t(w)``, ``J`` its steps left and
``t(w)`` seconds per step with ``w - 1`` workers and one parameter server (``SpeedCurve``; a
job gets 0 or at least ``MIN_NODES`` nodes, see ``mva``). With early termination (Section VI)
every ``S`` is multiplied by ``(1 / (1 - p)) ** gamma``, ``p`` the fraction trained; gamma 0
is the plain heuristics of Section IV.

- ``knee`` (Algorithm 1): each job's knee, the first ``w`` whose next node saves less than
  ``alpha`` of its time; the job with the shortest ``S`` at its knee goes first.
- ``hell`` (Algorithm 2): each job's ``argmin_w S(w) / E(w)``, ``E(w) = S(1) / (w S(w))``;
  the job with the least such value goes first.
- filling (Eq. 5), after either: the fewest idle nodes that make some job's ``S`` shorter
  than every allocated job's go to that job, until none does or no node is left.
- ``waterfill`` (the paper's baseline after [39]): ``MIN_NODES`` to each job in arrival order,
  then the rest one at a time to the job holding fewest, up to the nodes that still help it.
- ``srpt`` (the paper's SRPT-type baseline): the job that can finish first gets every node
  that shortens it, then the next one with what is left.
- moldable ``knee`` / ``hell`` (Section IV-C): a running job keeps its nodes; a waiting job
  starts only on its ideal count over the whole cluster (KNEE's ``alpha`` rising with the load,
  ``alpha_low + load * (alpha_high - alpha_low)``), in the order of the malleable metric. A job
  that does not fit waits and the next in order may start (the paper: the job "waits";
  it does not say the others do).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal, get_args

import numpy as np

from specon.policy.priority.mbasgd import GAMMA_MAX, early_termination_factor
from specon.sim.asgd.mva import MIN_NODES, Method, ServiceTimes, curve

Policy = Literal["knee", "hell", "waterfill", "srpt"]
Mode = Literal["malleable", "moldable"]
POLICIES: tuple[Policy, ...] = get_args(Policy)
MODES: tuple[Mode, ...] = get_args(Mode)
MOLDABLE_POLICIES: tuple[Policy, ...] = ("knee", "hell")


class SpeedCurve:
    """Seconds per step of one kind of job on 0..max_nodes nodes (``inf`` below MIN_NODES),
    with the per-budget choices of each heuristic worked out once."""

    __slots__ = ("_best", "_hell", "_knees", "_next_lower", "_st", "cap", "max_nodes", "ref", "step_time")

    def __init__(self, step_time: Sequence[float]) -> None:
        st = np.asarray(step_time, dtype=float)
        if st.ndim != 1 or len(st) <= MIN_NODES:
            raise ValueError(f"a speed curve needs step times for 0..{MIN_NODES} nodes at least")
        if not np.all(np.isinf(st[:MIN_NODES])) or not np.all(np.isfinite(st[MIN_NODES:])):
            raise ValueError(f"step times must be inf below {MIN_NODES} nodes and finite from there")
        if np.any(st[MIN_NODES:] <= 0):
            raise ValueError("step times must be positive")
        self.step_time = st
        self.max_nodes = len(st) - 1
        self.ref = float(st[MIN_NODES])  # S(1): one worker
        # HELL's S(w)/E(w) = w S(w)^2 / S(1): per step, w t(w)^2 / t_ref.
        hell_metric = np.full(len(st), math.inf)
        hell_metric[MIN_NODES:] = np.arange(MIN_NODES, len(st)) * st[MIN_NODES:] ** 2
        self._hell = _prefix_argmin(hell_metric)
        self._best = _prefix_argmin(st)
        self.cap = int(self._best[-1])  # the fewest nodes giving the top speed
        self._knees: dict[float, int] = {}
        self._st = [float(v) for v in st]
        # The next index with a strictly smaller step time (len(st) if none): filling's search.
        self._next_lower = [len(st)] * len(st)
        stack: list[int] = []
        for i, v in enumerate(self._st):
            while stack and v < self._st[stack[-1]]:
                self._next_lower[stack.pop()] = i
            stack.append(i)

    @classmethod
    def from_times(cls, times: ServiceTimes, max_nodes: int, method: Method = "hybrid") -> SpeedCurve:
        """The curve of a job profiled as ``times``, solved by ``method`` MVA."""
        if max_nodes < MIN_NODES:
            raise ValueError(f"max_nodes must be at least {MIN_NODES}, got {max_nodes}")
        xs = curve(times, max_nodes - 1, method)
        return cls([math.inf] * MIN_NODES + [1.0 / x for x in xs])

    def hell(self, budget: int) -> int:
        """``argmin_{w <= budget} S(w) / E(w)`` (0 when ``budget < MIN_NODES``)."""
        return int(self._hell[min(budget, self.max_nodes)]) if budget >= MIN_NODES else 0

    def best(self, budget: int) -> int:
        """The fewest nodes within ``budget`` giving the shortest ``S`` (0 if none fit)."""
        return int(self._best[min(budget, self.max_nodes)]) if budget >= MIN_NODES else 0

    def delta(self, nodes: int) -> float:
        """KNEE's relative speedup of the ``nodes``-th node, ``(S(w-1) - S(w)) / S(w-1)``
        (``inf`` for the first worker: without it the job makes no progress)."""
        if nodes <= MIN_NODES:
            return math.inf
        prev = self.step_time[nodes - 1]
        return float((prev - self.step_time[nodes]) / prev)

    def first_below(self, have: int, limit: int, threshold: float) -> int:
        """The least ``w`` in ``(have, limit]`` with ``t(w) < threshold``, or 0; for a
        ``threshold`` no higher than ``t(have)`` (a smaller step time first shows up as a new
        minimum after ``have``, so the chain of next-smaller indices finds it)."""
        k = have
        while True:
            k = self._next_lower[k]
            if k > limit or k > self.max_nodes:
                return 0
            if self._st[k] < threshold:
                return k

    def knee(self, alpha: float, budget: int) -> int:
        """``min{w <= budget : delta(w) >= alpha and delta(w + 1) < alpha}``, or the budget
        when every node up to it saves at least ``alpha`` (0 when ``budget < MIN_NODES``)."""
        if budget < MIN_NODES:
            return 0
        k = self._knees.get(alpha)
        if k is None:
            k = MIN_NODES
            while k < self.max_nodes and self.delta(k + 1) >= alpha:
                k += 1
            self._knees[alpha] = k
        return min(k, budget)


def _prefix_argmin(values: np.ndarray) -> np.ndarray:
    """For each budget b, the first index <= b of the least value (0 while all are inf)."""
    out = np.zeros(len(values), dtype=int)
    best, best_i = math.inf, 0
    for i, v in enumerate(values):
        if v < best:
            best, best_i = float(v), i
        out[i] = best_i
    return out


@dataclass(frozen=True, slots=True)
class JobView:
    """What a policy sees of one job."""

    id: int
    remaining: float  # steps left, J_i^t
    curve: SpeedCurve
    done: float = 0.0  # fraction trained, p_i^t (Section VI)
    nodes: int = 0  # nodes it holds now (a moldable job keeps them)


@dataclass(frozen=True, slots=True)
class Settings:
    """One policy and its knobs."""

    policy: Policy = "hell"
    mode: Mode = "malleable"
    alpha: float = field(default=0.01, metadata={"doc": "malleable KNEE's threshold (the paper's 0.01)"})
    # Moldable KNEE's alpha at load 0 and 1 (the paper gives no range): 0.01 is the malleable
    # alpha; at load 0.7 (the top of Fig. 13) 0.1 gives 0.073, a knee of 12-14 nodes on Table
    # III's large models (0.2 and 0.05 did worse at load 0.7 in our simulation, docs/asgd.md).
    alpha_low: float = 0.01
    alpha_high: float = 0.1
    gamma: float = 0.0  # early termination (Section VI); 0: off
    filling: bool = True

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ValueError(f"policy must be one of {', '.join(POLICIES)}, got {self.policy!r}")
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        if self.mode == "moldable" and self.policy not in MOLDABLE_POLICIES:
            raise ValueError(
                f"moldable scheduling has {' and '.join(MOLDABLE_POLICIES)} only, got {self.policy!r}"
            )
        for name in ("alpha", "alpha_low", "alpha_high"):
            v = getattr(self, name)
            if not (math.isfinite(v) and 0.0 <= v <= 1.0):
                raise ValueError(f"{name} must be between 0 and 1, got {v}")
        if self.alpha_low > self.alpha_high:
            raise ValueError(f"alpha_low {self.alpha_low} is above alpha_high {self.alpha_high}")
        if not (math.isfinite(self.gamma) and 0.0 <= self.gamma <= GAMMA_MAX):
            raise ValueError(f"gamma must be between 0 and {GAMMA_MAX:g}, got {self.gamma}")


def allocate(jobs: Sequence[JobView], nodes: int, settings: Settings, load: float = 0.0) -> dict[int, int]:
    """Nodes for every job (0: it waits) on a cluster of ``nodes`` nodes. Malleable policies
    reassign them all; moldable ones keep each running job's ``nodes`` and start waiting
    jobs on what is free. ``load`` (``lambda E[S(1)] / n``) sets moldable KNEE's alpha."""
    _check(jobs, nodes, settings, load)
    adj = {j.id: j.remaining * early_termination_factor(j.done, settings.gamma) for j in jobs}
    if settings.mode == "moldable":
        return _moldable(jobs, nodes, settings, load, adj)
    out = dict.fromkeys((j.id for j in jobs), 0)
    if settings.policy == "waterfill":
        _waterfill(jobs, nodes, out)
        return out
    time_at: Callable[[SpeedCurve, int], float] = lambda c, w: float(c.step_time[w])  # noqa: E731
    if settings.policy == "srpt":
        _greedy(jobs, nodes, adj, out, choose=lambda c, b: c.best(b), metric=time_at)
        return out
    if settings.policy == "knee":
        left = _greedy(jobs, nodes, adj, out, choose=lambda c, b: c.knee(settings.alpha, b), metric=time_at)
    else:
        left = _greedy(jobs, nodes, adj, out, choose=lambda c, b: c.hell(b), metric=_hell_metric)
    if settings.filling:
        _fill(jobs, left, adj, out)
    return out


def _check(jobs: Sequence[JobView], nodes: int, settings: Settings, load: float) -> None:
    if isinstance(nodes, bool) or not isinstance(nodes, int) or nodes < 0:
        raise ValueError(f"nodes must be a whole number >= 0, got {nodes!r}")
    if not (math.isfinite(load) and load >= 0.0):
        raise ValueError(f"load must be finite and >= 0, got {load}")
    ids = [j.id for j in jobs]
    if len(set(ids)) != len(ids):
        raise ValueError("job ids must be unique")
    held = 0
    for j in jobs:
        if not (math.isfinite(j.remaining) and j.remaining >= 0.0):
            raise ValueError(f"job {j.id}: remaining steps must be finite and >= 0, got {j.remaining}")
        if not (math.isfinite(j.done) and 0.0 <= j.done <= 1.0):
            raise ValueError(f"job {j.id}: fraction done must be in [0, 1], got {j.done}")
        if j.nodes < 0 or 0 < j.nodes < MIN_NODES:
            raise ValueError(f"job {j.id}: holds {j.nodes} nodes; a job holds 0 or at least {MIN_NODES}")
        held += j.nodes
    if settings.mode == "moldable" and held > nodes:
        raise ValueError(f"running jobs hold {held} nodes, more than the cluster's {nodes}")


def _hell_metric(c: SpeedCurve, w: int) -> float:
    # S(w) / E(w) per step of remaining work: w t(w)^2 / t(1).
    return float(w * c.step_time[w] ** 2 / c.ref)


def _groups(jobs: Sequence[JobView], adj: dict[int, float]) -> list[list[JobView]]:
    """Jobs by curve, each list least adjusted remaining first (ties: input order). Within a
    curve every heuristic picks the same count for all jobs and its metric grows with the
    remaining work, so only each list's head can be the next pick."""
    by: dict[int, list[JobView]] = {}
    for j in jobs:
        by.setdefault(id(j.curve), []).append(j)
    return [sorted(g, key=lambda j: adj[j.id]) for g in by.values()]


def _greedy(
    jobs: Sequence[JobView],
    nodes: int,
    adj: dict[int, float],
    out: dict[int, int],
    *,
    choose: Callable[[SpeedCurve, int], int],
    metric: Callable[[SpeedCurve, int], float],
) -> int:
    """Algorithms 1 and 2 (and the SRPT-type baseline): the job whose choice within the nodes
    left scores least (``choose``: nodes for a budget; ``metric``: value per remaining step)
    gets it, until no job or too few nodes are left. Returns the nodes left over."""
    groups = [g for g in _groups(jobs, adj) if g]
    heads = [0] * len(groups)
    left = nodes
    while left >= MIN_NODES:
        pick, pick_w, pick_v = -1, 0, math.inf
        for gi, g in enumerate(groups):
            if heads[gi] >= len(g):
                continue
            j = g[heads[gi]]
            w = choose(j.curve, left)
            if w < MIN_NODES:
                continue
            v = adj[j.id] * metric(j.curve, w)
            if v < pick_v:
                pick, pick_w, pick_v = gi, w, v
        if pick < 0:
            break
        out[groups[pick][heads[pick]].id] = pick_w
        heads[pick] += 1
        left -= pick_w
    return left


def _fill(jobs: Sequence[JobView], left: int, adj: dict[int, float], out: dict[int, int]) -> None:
    """Eq. (5): the fewest idle nodes that bring some job below every allocated job's S."""
    running = [j for j in jobs if out[j.id] > 0]
    if not running or left <= 0:
        return
    s_min = min(adj[j.id] * float(j.curve.step_time[out[j.id]]) for j in running)
    # A waiting job can only beat the least-remaining waiting job of its own curve.
    groups = [[j for j in g if out[j.id] == 0] for g in _groups(jobs, adj)]
    heads = [0] * len(groups)
    while left > 0:
        best: tuple[int, float, JobView, int] | None = None
        waiting = [(g[h], gi) for gi, (g, h) in enumerate(zip(groups, heads, strict=True)) if h < len(g)]
        for j, gi in [*((r, -1) for r in running), *waiting]:
            a = adj[j.id]
            if a <= 0:
                continue
            have = out[j.id]
            w = j.curve.first_below(have, have + left, s_min / a)
            if w == 0:
                continue
            extra, s_new = w - have, a * float(j.curve.step_time[w])
            if best is None or (extra, s_new) < (best[0], best[1]):
                best = (extra, s_new, j, gi)
        if best is None:
            return
        extra, s_new, j, gi = best
        if gi >= 0:
            running.append(j)
            heads[gi] += 1
        out[j.id] += extra
        left -= extra
        s_min = s_new


def _waterfill(jobs: Sequence[JobView], nodes: int, out: dict[int, int]) -> None:
    """The minimum to each job in arrival (input) order, then one node at a time to the job
    holding fewest that still speeds up with one more."""
    left = nodes
    running: list[JobView] = []
    for j in jobs:
        if left < MIN_NODES:
            break
        if j.curve.cap >= MIN_NODES and j.remaining > 0:
            out[j.id] = MIN_NODES
            running.append(j)
            left -= MIN_NODES
    while left > 0:
        room = [j for j in running if out[j.id] < j.curve.cap]
        if not room:
            return
        level = min(out[j.id] for j in room)
        for j in room:
            if left == 0:
                return
            if out[j.id] == level:
                out[j.id] += 1
                left -= 1


def _moldable(
    jobs: Sequence[JobView], nodes: int, settings: Settings, load: float, adj: dict[int, float]
) -> dict[int, int]:
    out = {j.id: j.nodes for j in jobs}
    free = nodes - sum(out.values())
    waiting = [j for j in jobs if j.nodes == 0]
    if settings.policy == "knee":
        alpha = min(1.0, settings.alpha_low + load * (settings.alpha_high - settings.alpha_low))
        ideal = {j.id: j.curve.knee(alpha, nodes) for j in waiting}
        value = {j.id: adj[j.id] * float(j.curve.step_time[ideal[j.id]]) for j in waiting if ideal[j.id]}
    else:
        ideal = {j.id: j.curve.hell(nodes) for j in waiting}
        value = {j.id: adj[j.id] * _hell_metric(j.curve, ideal[j.id]) for j in waiting if ideal[j.id]}
    for j in sorted((j for j in waiting if j.id in value), key=lambda j: value[j.id]):
        if free < MIN_NODES:
            break
        if ideal[j.id] <= free:
            out[j.id] = ideal[j.id]
            free -= ideal[j.id]
    return out
