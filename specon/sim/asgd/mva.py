"""The throughput of one asynchronous-SGD job by Mean Value Analysis (MB-ASGD, Section III).

The closed queueing network of Fig. 6: ``w`` tasks, one per worker, each cycling through its
worker (computing a gradient), the uplink (gradient to the parameter server), the parameter
server (applying it) and the downlink (parameters back). The worker stations are never shared;
the uplink, server and downlink are shared by all of a job's workers.

Choices, where the paper leaves them open:

- One class of population ``w`` instead of ``w`` classes of population 1. With homogeneous
  workers (as the paper assumes after Section III-B) every class has the same service times,
  and the ``w`` one-task worker stations form one delay (infinite-server) station of mean
  ``worker``: a task there never waits. Eq. (1)-(3) with ``n - e_k`` holding ``m - 1`` tasks
  sum to the single-class recursion over ``m = 1..w``, so the result is identical and costs
  O(w) rather than O(2^w).
- The parameter server is FCFS and solved by Eq. (1) (the product-form assumption of
  exponential service, as the paper does in all three methods); only the links change.
- ``exact``: links processor-sharing, Eq. (1). ``approx``: links FCFS with deterministic
  service, Eq. (2) ([31, Eq. 3.29]). ``hybrid``: Eq. (3), the links' response times weighted by
  ``g(rho)`` of Eq. (4), where ``rho`` is the link's total utilisation (all classes) with the
  arriving task removed (population ``m - 1``), the same point Eq. (2) reads ``rho`` at; the
  utilisation of one class alone could never exceed ``1/w`` and the one at ``m`` is not known
  before ``T(m)`` is.
- ``approx`` and ``hybrid`` are capped at ``1 / bottleneck``: Eq. (2) alone overshoots that
  physical bound near saturation. Neither is monotone in ``w`` (the paper says as much of
  Approximate MVA in Fig. 11b); ``exact`` is.
- Every service time must be finite and positive: a profile that measured zero for a
  station has measured nothing, and the caller should clamp it to its resolution.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, get_args

Method = Literal["exact", "approx", "hybrid"]
METHODS: tuple[Method, ...] = get_args(Method)

# Eq. (4): the link is shared (processor sharing) only above this utilisation.
G_KNEE = 0.8
# Beyond this many workers the recursion is refused: no cluster here has as many nodes.
MAX_WORKERS = 100_000


@dataclass(frozen=True, slots=True)
class ServiceTimes:
    """Mean seconds per mini-batch of one async-SGD job, as a one-worker profile measures them."""

    worker: float  # a worker computing one mini-batch's gradient (its own station: never shared)
    uplink: float  # sending one gradient worker -> PS over the PS's link (shared by all workers)
    server: float  # the PS applying one update (shared, FCFS)
    downlink: float  # sending the parameters PS -> worker over the PS's link (shared)

    def __post_init__(self) -> None:
        for name in ("worker", "uplink", "server", "downlink"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ValueError(f"service time {name} must be a number of seconds, got {value!r}")
            if not math.isfinite(value) or value <= 0.0:
                raise ValueError(f"service time {name} must be finite and positive seconds, got {value!r}")

    @property
    def cycle(self) -> float:
        """Seconds of one mini-batch with one worker: the sum of the four stations."""
        return self.worker + self.uplink + self.server + self.downlink

    @property
    def bottleneck(self) -> float:
        """The largest shared service time: ``1 / bottleneck`` bounds the throughput."""
        return max(self.uplink, self.server, self.downlink)

    def scaled(self, factor: float) -> ServiceTimes:
        """Every time multiplied by ``factor`` (a slower or faster node)."""
        return ServiceTimes(
            self.worker * factor, self.uplink * factor, self.server * factor, self.downlink * factor
        )


def g(rho: float) -> float:
    """Eq. (4): the weight of processor sharing on a link of utilisation ``rho``."""
    return min(1.0, max(0.0, (rho - G_KNEE) / (1.0 - G_KNEE)))


@dataclass(frozen=True, slots=True)
class Solution:
    """The network with ``workers`` tasks: throughput and the mean per shared station."""

    workers: int
    throughput: float  # mini-batches per second at the PS
    response: float  # seconds of one cycle (worker + links + server, waiting included)
    queue_uplink: float
    queue_server: float
    queue_downlink: float
    util_uplink: float
    util_server: float
    util_downlink: float


def check_workers(workers: int) -> None:
    """ValueError unless ``workers`` is a whole number from 1 to MAX_WORKERS."""
    if isinstance(workers, bool) or not isinstance(workers, int):
        raise ValueError(f"workers must be a whole number, got {workers!r}")
    if not 1 <= workers <= MAX_WORKERS:
        raise ValueError(f"workers must be between 1 and {MAX_WORKERS}, got {workers}")


def check_method(method: str) -> Method:
    """``method`` as a Method, or ValueError naming the choices."""
    for m in METHODS:
        if m == method:
            return m
    raise ValueError(f"method must be one of {', '.join(METHODS)}, got {method!r}")


def _link_time(s: float, queue: float, util: float, method: Method) -> float:
    ps = s * (1.0 + queue)  # Eq. (1)
    if method == "exact":
        return ps
    fcfs = s + s * (queue - 0.5 * util)  # Eq. (2), one class
    if method == "approx":
        return fcfs
    gamma = g(util)  # Eq. (3)
    return gamma * ps + (1.0 - gamma) * fcfs


def solutions(times: ServiceTimes, max_workers: int, method: Method = "hybrid") -> tuple[Solution, ...]:
    """The MVA recursion for 1..max_workers tasks, each population's means."""
    if not isinstance(times, ServiceTimes):
        raise ValueError(f"times must be ServiceTimes, got {type(times).__name__}")
    check_workers(max_workers)
    method = check_method(method)
    out: list[Solution] = []
    # Means with m - 1 tasks (the arrival theorem): queue lengths and utilisations.
    nu = ns = nd = 0.0
    uu = ud = 0.0
    for m in range(1, max_workers + 1):
        tu = _link_time(times.uplink, nu, uu, method)
        td = _link_time(times.downlink, nd, ud, method)
        ts = times.server * (1.0 + ns)  # FCFS server, Eq. (1)
        cycle = times.worker + tu + ts + td
        # Eq. (2)'s residual-time correction can report a link or the server busier than 100 %
        # (up to a third above 1 / bottleneck near saturation); no station can serve faster.
        x = min(m / cycle, 1.0 / times.bottleneck)
        nu, ns, nd = x * tu, x * ts, x * td
        uu, us, ud = x * times.uplink, x * times.server, x * times.downlink
        out.append(Solution(m, x, cycle, nu, ns, nd, uu, us, ud))
    return tuple(out)


def throughput(times: ServiceTimes, workers: int, method: Method = "hybrid") -> float:
    """Mini-batches per second at the PS with ``workers`` workers (the closed network of
    Section III solved by MVA)."""
    check_workers(workers)
    return solutions(times, workers, method)[-1].throughput


def curve(times: ServiceTimes, max_workers: int, method: Method = "hybrid") -> tuple[float, ...]:
    """throughput for 1..max_workers."""
    return tuple(s.throughput for s in solutions(times, max_workers, method))


# Nodes, as the scheduler counts them (Section IV): a job on ``w >= 2`` nodes runs one parameter
# server and ``w - 1`` workers. The paper also names a one-node job (``w - 1`` workers "when
# w > 1"), but never says how it runs; a lone node that is both worker and server would make
# two nodes no faster than one and stop KNEE at one node for every job, so a job here gets 0
# or at least MIN_NODES nodes, and its one-node reference time S(1) is its one-worker time.
MIN_NODES = 2


def nodes_for(workers: int) -> int:
    """Nodes a job with ``workers`` workers holds: the workers and the parameter server."""
    return workers + 1


def speedup(times: ServiceTimes, workers: int, method: Method = "hybrid") -> float:
    """``X(w) / X(1)``: how much faster ``workers`` workers train than one."""
    xs = curve(times, workers, method)
    return xs[-1] / xs[0]


def relative_speedup(times: ServiceTimes, workers: int, method: Method = "hybrid") -> float:
    """KNEE's ``delta(w)``: the fraction of the service time the ``workers``-th worker saves,
    ``(S(w-1) - S(w)) / S(w-1) = 1 - X(w-1) / X(w)`` (positive when it helps). The paper prints
    the difference the other way round with ``alpha < 0`` in Algorithm 1 but a positive
    ``alpha = 0.01`` in the text; this sign keeps ``alpha`` positive. The first worker saves
    everything (``inf``): a job with no worker makes no progress."""
    check_workers(workers)
    if workers == 1:
        return math.inf
    xs = curve(times, workers, method)
    return 1.0 - xs[-2] / xs[-1]


def efficiency(times: ServiceTimes, workers: int, method: Method = "hybrid") -> float:
    """HELL's ``E = s / w``: the speedup over one worker per node, the parameter server's node
    counted (``workers + 1`` nodes), so one worker on two nodes is 0.5 efficient."""
    return speedup(times, workers, method) / nodes_for(workers)
