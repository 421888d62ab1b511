"""The versioned policy file's sections (``apiVersion: specon/v1alpha1``): schema and defaults.

Every knob of SPEC.md is a field here, with the SPEC default. ``mode: paper`` swaps in
the values that reproduce the paper's printed behaviour (``PAPER_OVERRIDES``) before the
file's own values are applied, so a paper-mode file may still override single knobs.

Loading is: parse YAML (1.2 scalars) -> lay the file over the mode's defaults -> check
every field against its type hint (``specon.wire.codec``) and the rules no type can express
(``_semantic_problems``) -> a frozen ``Policy``, or one ``PolicyError`` that lists every
problem as ``path: problem`` in file order.

The classifiers and the priority rules are not listed here: ``monitor.classifier`` and
``priority.rule`` take the names their registries hold (``specon.policy.classifier``,
``specon.policy.priority.rules``), and ``MonitorConfig`` and ``PriorityConfig`` are built
from them (``_with_sections``): the section's own knobs, then one sub-section per
classifier or rule with knobs, under its name, with its defaults; their help (``DOCS``)
and checks come from the same declarations.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from specon.model import RECLAIM_TAINTS, Direction
from specon.policy.classifier import CLASSIFIERS
from specon.policy.plugin import Plugin, choices_doc, section_docs
from specon.policy.priority.rules import RULES
from specon.policy.robust_config import RobustConfig

API_VERSION = "specon/v1alpha1"
KIND = "Policy"

# The pluggable things, by the section that chooses among them: each one's name is a choice
# of the section's choosing key, and each one with knobs has its own sub-section, keyed by
# its name (``monitor.robust``, ``priority.fsp``). Their registries are the only lists.
PLUGGABLE: Mapping[str, Mapping[str, Plugin[Any]]] = {"monitor": CLASSIFIERS, "priority": RULES}

if TYPE_CHECKING:
    # Any registered name; the schema checks it against the registry (at run time these
    # are the Literal of the registered names).
    ClassifierName = str
    PriorityRule = str
else:
    ClassifierName = Literal[tuple(CLASSIFIERS)]
    PriorityRule = Literal[tuple(RULES)]

Mode = Literal["default", "paper"]
Normalize = Literal["max", "previous", "none"]
Aggregate = Literal["mean", "last"]
StaleHandling = Literal["skip", "zero"]
FormatName = Literal["auto", "jsonl", "csv", "text"]
ScoreMode = Literal["count", "per_capacity"]
RebalanceMode = Literal["balanced", "work", "paper", "off"]
RebalanceWhen = Literal["all_migrated", "always"]
DurationFrom = Literal["converged", "migrated", "placed"]
MigrationMode = Literal["checkpoint", "criu"]
GpuMechanism = Literal["none", "freeze", "mps", "both"]


@dataclass(frozen=True, slots=True)
class ProgressConfig:
    """How a job's progress log is read (SPEC §2)."""

    format: FormatName = "auto"
    metric: str = "loss"
    direction: Direction = Direction.MINIMIZE
    # Free-text pattern; must have one group capturing the number. ``{metric}`` is
    # replaced by the escaped metric name.
    regex: str = (
        r"(?i)\b{metric}\b\s*[:=]?\s*([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|nan|[-+]?inf(?:inity)?)"
    )
    # Longer lines are skipped (counted) rather than buffered without bound.
    max_line_bytes: int = 1 << 20
    # Bytes of one log read by one poll, at most: a huge log is read over several polls
    # (it lags, it never stalls the agent), and a first poll skips to its end.
    max_poll_bytes: int = 1 << 21


@dataclass(frozen=True, slots=True)
class _MonitorKnobs:
    """Algorithm 1, the agent's container monitor (SPEC §3)."""

    # robust (doubling test) won the convergence-detection benchmark (bench_detection).
    classifier: ClassifierName = "robust"
    interval: float = 30.0  # Δ, seconds
    alpha: float = 0.01
    normalize: Normalize = "max"
    aggregate: Aggregate = "mean"
    stale: StaleHandling = "skip"
    stale_ticks: int = 10
    # At least this many PC+WC containers must share the worker for a request (SPEC §3.3).
    request_min_active: int = 1
    # Then each classifier's knobs, under its name (``MonitorConfig``).


def _with_sections(
    knobs: type[Any], section: str, tuned: Mapping[str, Mapping[str, object]] | None = None
) -> type[Any]:
    """The dataclass of policy-file section ``section`` (``MonitorConfig``, ...): ``knobs``'
    fields, then one field per pluggable thing of the section that has knobs, named after
    it, of its knobs' class, defaulting to their ``args()`` (with ``tuned``'s values where
    the shipped policy tunes them). Frozen, like every section."""
    extra: list[tuple[str, type[Any], Any]] = []
    for plugin in PLUGGABLE[section].values():
        if plugin.args is None:
            continue
        changes = (tuned or {}).get(plugin.name)
        factory = plugin.args if not changes else functools.partial(_tuned, plugin.args, changes)
        extra.append((plugin.name, plugin.args, field(default_factory=factory)))
    name = f"{section.capitalize()}Config"
    cls = dataclasses.make_dataclass(name, extra, bases=(knobs,), frozen=True, slots=True)
    cls.__module__, cls.__qualname__, cls.__doc__ = __name__, name, knobs.__doc__
    return cls


def _tuned(args: type[Any], changes: Mapping[str, object]) -> Any:
    return dataclasses.replace(args(), **changes)


if TYPE_CHECKING:

    @dataclass(frozen=True, slots=True)
    class MonitorConfig(_MonitorKnobs):
        # The robust classifier's knobs, typed for the code that reads them by name. At run
        # time every classifier's knobs are a field (``_with_sections``), these included.
        robust: RobustConfig = field(default_factory=RobustConfig)

else:
    MonitorConfig = _with_sections(_MonitorKnobs, "monitor")


@dataclass(frozen=True, slots=True)
class Weights:
    progressing: float = 2.0
    watching: float = 1.5
    converged: float = 1.0


@dataclass(frozen=True, slots=True)
class PlacementConfig:
    """Algorithm 2, target selection (SPEC §4)."""

    weights: Weights = field(default_factory=Weights)
    score: ScoreMode = "count"
    tolerance: float = 1e-9
    # Re-decided with the warm restore's costs (`python -m bench bench_costs`, A1-A5, 3
    # seeds, moves drawn from the measured law, costs learned): 2 and 3 decide exactly as 1
    # (a job Algorithm 2 has decided for arrives frozen and never asks again), so 1 stays.
    max_migrations_per_container: int = 1
    # A move Algorithm 2 picks is made only if the work model (specon.policy.work) predicts
    # it saves more completion time than it costs; otherwise the job stays. Jobs that report
    # no remaining work are decided by the scores alone. The same sweep: on beats off by
    # 1.2 points of average JCT against DS (fsp: 34.5 against 33.3 % mean over A1-A5).
    require_gain: bool = True


@dataclass(frozen=True, slots=True)
class RebalanceConfig:
    """Algorithm 3, rebalancing (SPEC §5)."""

    mode: RebalanceMode = "balanced"
    # The paper waits until every container is migrated (paper mode); rebalancing on every
    # manager tick is the default because it measured better in the simulator on every
    # scenario (A1, A3-A5: `python -m bench bench_sim`, see the README).
    when: RebalanceWhen = "always"
    duration_from: DurationFrom = "converged"
    max_rebalances_per_container: int = 1


@dataclass(frozen=True, slots=True)
class MigrationConfig:
    """The save/restore state machine and its limits (SPEC §6)."""

    max_concurrent: int = 2
    max_concurrent_per_worker: int = 1
    grace_period: float = 30.0  # seconds between SIGTERM and SIGKILL on save
    dry_run: bool = False
    # Deadlines (seconds in one state) past which a migration rolls back. A save ends within
    # grace_period (then SIGKILL; measured saves take 0.2-2 s) and its result rides the next
    # heartbeat: 120 s leaves room for both on a busy node. A start is a process or pod start
    # plus the job's own set-up (measured 3.7-18 s locally, 2.9 s for a CRIU restore); 300 s
    # also covers pulling a training image on Kubernetes.
    save_timeout: float = 120.0
    restore_timeout: float = 300.0
    # A failed migration whose source and target have both been silent this many
    # worker_timeouts stops holding the migration budget (it still restarts the job as
    # soon as one of them is back).
    park_after: float = 3.0
    # No thrashing: a job stays at least this long on a worker before any move (a move
    # back 1.6 s after a move was seen in a real run). The cost of a move, for the work
    # model, and the prior of what the manager learns (``learn_costs``): downtime (SIGTERM
    # to the first record on the target) and the CPU the restore takes from the target's
    # jobs, measured with the warm interpreter (`python -m bench bench_restore`: 3.1 s
    # median between busy 0.5-CPU workers, 0.34 CPU-s start-up mean over the five models;
    # a cold interpreter took 13.9 s and 2.06 CPU-s; specon/data/move_costs.json).
    min_residence: float = 60.0
    move_downtime: float = 3.1
    restore_cpu: float = 0.34
    # Learn both figures from the moves made (per backend and job size), the two above as
    # the prior counting as cost_prior_weight moves (``specon.policy.move_costs``).
    learn_costs: bool = True
    cost_prior_weight: float = 5.0
    # Fairness of a move under shortest-first priority: the moved job may go ahead of a job
    # on the target only if it needs at most this share of that job's remaining work (so no
    # job waits more than half again its own remaining time for one move). Measured: without
    # it one A5 job took x2.5 its DS JCT (`python -m bench bench_sim`).
    max_push: float = 0.5
    # How a job moves on the Docker backend: checkpoint = the job contract (SIGTERM, the job
    # saves, a fresh container resumes it); criu = Docker's CRIU checkpoint of the whole
    # process, restored on the target (falls back to checkpoint where CRIU cannot work: GPU
    # containers, engines without --experimental or criu). A job's label
    # specon.io/migration-mode overrides it. Other backends always use checkpoint.
    mode: MigrationMode = "checkpoint"


@dataclass(frozen=True, slots=True)
class _PriorityKnobs:
    """Priority on the node: the CPU weights a worker's agent gives its containers
    (``specon.policy.priority``; each rule's module documents its paper and its arguments)."""

    # Each job's early, steep part soon, then shortest remaining work first (``phased``).
    # The default because it reaches quality (95 % of a job's loss reduction) no later than
    # DS on A1-A5 and the example scenarios, where shortest-first (``fsp``, the previous
    # default) was up to x2.1 later (A2), and still cuts average JCT by 13-37 % against DS
    # (`python -m bench bench_sim`; docs/priority.md "The default"). Each rule's own
    # ``Args()`` are its paper's (``peer_priority``).
    rule: PriorityRule = "phased"
    # Then each rule's knobs, under its name (``PriorityConfig``; read them with
    # ``specon.policy.priority.rules.args_of``).


# Where the shipped policy's knobs of a rule differ from the rule's own (its paper's).
_TUNED: dict[str, dict[str, object]] = {"fsp": {"aging": 0.5}}

if TYPE_CHECKING:
    PriorityConfig = _PriorityKnobs
else:
    PriorityConfig = _with_sections(_PriorityKnobs, "priority", _TUNED)


def peer_priority(rule: PriorityRule) -> PriorityConfig:
    """``rule`` with every rule's arguments at its module's ``Args()`` (its paper's), as the
    peer policies run it (the default policy tunes some: ``PriorityConfig``)."""
    papers = {name: r.args() for name, r in RULES.items() if r.args is not None}
    return PriorityConfig(rule=rule, **papers)


@dataclass(frozen=True, slots=True)
class MessagingConfig:
    """Agent <-> manager messaging (SPEC §7)."""

    heartbeat_interval: float = 5.0
    worker_timeout: float = 20.0
    max_body_bytes: int = 1 << 20
    # More containers than a node can hold: a heartbeat over it is refused (400), so one
    # agent cannot grow the manager's memory at will.
    max_containers_per_heartbeat: int = 1000
    # Workers and containers unseen for this many worker_timeouts are forgotten (unless
    # a migration in flight still names them); the journal keeps their marks.
    prune_after: float = 10.0


@dataclass(frozen=True, slots=True)
class RecoveryConfig:
    """Every unfinished job keeps one live copy: the manager restores a job that runs nowhere
    (``specon.coordinator.reconcile``; SPEC §6.5)."""

    enabled: bool = True
    # A worker silent this long is lost and its jobs are restored elsewhere. 3 worker_timeouts:
    # a manager failover (measured under 10 s) or a brief partition does not trigger it, and
    # a job is back within about a minute, as Kubernetes' node-monitor grace period (40-50 s)
    # plus the restore. A false loss costs no second copy: a start is refused while a host
    # may still run the job.
    after: float = 60.0
    # Attempts for one job back off: backoff, doubling, at most max_backoff seconds (a
    # Kubernetes Job's pod back-off is 10 s doubling to 6 min).
    backoff: float = 10.0
    max_backoff: float = 300.0
    # Restarts of a job whose copy ended without finishing (a crash, an OOM kill, a stop) or
    # that nobody reported after a manager restart, before it is left failed (a Job's
    # backoffLimit, also 6). Restores after a host loss do not count: not the job's fault.
    limit: int = 6
    # A worker carrying one of these taint keys (a reclaim notice) is drained at once: each
    # job is saved within evacuate_deadline seconds of the notice, else restored from its
    # newest periodic checkpoint. GKE's notice comes 30 s before the node goes, an AWS spot
    # interruption's 2 min: 25 s leaves the shortest a heartbeat to spare.
    evacuate_taints: tuple[str, ...] = RECLAIM_TAINTS
    evacuate_deadline: float = 25.0
    # A cordoned worker (node.kubernetes.io/unschedulable) is drained too, with no deadline.
    evacuate_cordoned: bool = True


@dataclass(frozen=True, slots=True)
class GpuShareConfig:
    """Priority on a GPU: how a worker's agent shares each GPU among the jobs on it, by the
    weights of the ``priority`` rule (``specon.policy.gpu_share``; docs/gpu.md)."""

    # freeze: the top-weighted jobs run, the others are frozen where they stand (cgroup
    # freezer or SIGSTOP, memory kept): on an H100 a stopped job gave the other its full rate
    # within 0.05 s, where time-slicing two jobs ran each at 47 % (94 % together). none:
    # plain time-slicing (the DS baseline); mps: CUDA_MPS_ACTIVE_THREAD_PERCENTAGE by weight
    # at each start (fixed for a process's life); both: freeze quanta and MPS percentages.
    mechanism: GpuMechanism = "freeze"
    # Jobs running at once on one GPU under freeze and both.
    concurrency: int = 1
    # A job switched in runs at least this long before a job of higher weight may displace
    # it, and an equal-weight job waits this long for its turn: a switch costs under 0.05 s
    # (measured), so 2 s quanta lose at most 2.5 %, less than the 6 % time-slicing loses.
    quantum: float = 2.0
    # Share of a GPU's memory kept free: frozen jobs are suspended (checkpoint and exit) when
    # the running jobs' and theirs would leave less, a suspended job resumes only into it.
    memory_headroom: float = 0.05
    # The smallest MPS percentage a job gets (10 % ran at 11 % of its speed alone).
    mps_min_percentage: int = 10


@dataclass(frozen=True, slots=True)
class Policy:
    """A complete, validated, defaulted policy."""

    # Kubernetes-style spelling on disk; the codec reads the key from the metadata.
    api_version: str = field(default=API_VERSION, metadata={"key": "apiVersion"})
    kind: str = KIND
    mode: Mode = "default"
    progress: ProgressConfig = field(default_factory=ProgressConfig)
    monitor: MonitorConfig = field(default_factory=MonitorConfig)
    placement: PlacementConfig = field(default_factory=PlacementConfig)
    rebalance: RebalanceConfig = field(default_factory=RebalanceConfig)
    migration: MigrationConfig = field(default_factory=MigrationConfig)
    priority: PriorityConfig = field(default_factory=PriorityConfig)
    gpu: GpuShareConfig = field(default_factory=GpuShareConfig)
    messaging: MessagingConfig = field(default_factory=MessagingConfig)
    recovery: RecoveryConfig = field(default_factory=RecoveryConfig)


# Values that reproduce the paper's printed behaviour (SPEC: "paper mode"), as
# section -> field -> value. Applied before the file's own values.
PAPER_OVERRIDES: dict[str, dict[str, object]] = {
    "monitor": {
        "classifier": "specon",
        "normalize": "none",
        "aggregate": "last",
        "stale": "zero",
        "request_min_active": 2,  # paper line 15: |PC| + |WC| > 1
    },
    "placement": {"score": "count", "require_gain": False},
    "rebalance": {"mode": "paper", "when": "all_migrated"},
    # The paper has no priority on the node and no residence time or cost model.
    "migration": {"min_residence": 0.0},
    "priority": {"rule": "none"},
    # Nor any on a GPU: plain time-slicing.
    "gpu": {"mechanism": "none"},
}


# --- documentation of every knob (``specon config defaults`` prints it) ------------------
# Keyed by the dotted path in the file. A test checks that every field has an entry;
# allowed values of Literal/enum fields are appended from the schema itself.
DOCS: dict[str, str] = {
    "apiVersion": "policy file format version (required)",
    "kind": "always Policy (required)",
    "mode": "paper: start from the values that reproduce the paper, then apply this file",
    "progress": "Reading job progress logs (SPEC §2)",
    "progress.format": "log format; auto detects JSON lines, CSV with a header, or free text",
    "progress.metric": "evaluation value E read from the log (jobs may override per job)",
    "progress.direction": "whether the metric improves by falling or rising",
    "progress.regex": "free-text pattern; {metric} becomes the escaped metric name; "
    "its one group (or the group named value) is the number",
    "progress.max_line_bytes": "longer lines are skipped and counted",
    "progress.max_poll_bytes": "bytes of one log read per tick at most; the rest is read at the next "
    "ticks; a log already longer than this when first seen is read from its end",
    "monitor": "Algorithm 1, the agent's container monitor (SPEC §3)",
    "monitor.classifier": choices_doc(CLASSIFIERS.values(), " = "),
    "monitor.interval": "tick Δ in seconds",
    "monitor.alpha": "threshold alpha on the normalised change G (specon, and robust's change test)",
    "monitor.normalize": "max: divide by the largest |E| so far; previous: by |E(t-1)|; none: absolute",
    "monitor.aggregate": "E(t) from the samples of one tick: their mean or the last one",
    "monitor.stale": "a tick without samples: skip it, or treat it as G = 0 (paper)",
    "monitor.stale_ticks": "stale ticks in a row before a container is reported stalled (0 = never)",
    "monitor.request_min_active": "PC+WC containers needed on the worker before a CC container may request",
    **section_docs("monitor", CLASSIFIERS.values()),
    "placement": "Algorithm 2, target selection on each request (SPEC §4)",
    "placement.weights": "S_w = progressing*|PC| + watching*|WC| + converged*|CC|; strictly decreasing",
    "placement.weights.progressing": "weight of a progressing container",
    "placement.weights.watching": "weight of a watching container",
    "placement.weights.converged": "weight of a converged container",
    "placement.score": "count: the paper's score; per_capacity: divided by the worker's CPU cores",
    "placement.tolerance": "scores closer than this are equal",
    "placement.max_migrations_per_container": "times one container may be reallocated",
    "placement.require_gain": "make a move Algorithm 2 picks only if the work model predicts it "
    "saves more completion time than it costs (else the job stays)",
    "rebalance": "Algorithm 3, rebalancing (SPEC §5)",
    "rebalance.mode": "balanced: even out loads; work: the move that saves the most predicted "
    "completion time, if it saves more than it costs (specon.policy.work); paper: the printed "
    "algorithm; off: never",
    "rebalance.when": "all_migrated: once every live container is migrated; always: every tick",
    "rebalance.duration_from": "converged duration counted from t_cc, from the migrated mark, or from "
    "when the container was placed on its worker (placed: a convergence-blind balancer)",
    "rebalance.max_rebalances_per_container": "times one container may be moved by rebalancing",
    "migration": "The save/restore state machine and its limits (SPEC §6)",
    "migration.max_concurrent": "migrations in flight cluster-wide",
    "migration.max_concurrent_per_worker": "migrations in flight touching one worker",
    "migration.grace_period": "seconds between SIGTERM and SIGKILL when saving",
    "migration.save_timeout": "seconds a save may take before the migration rolls back",
    "migration.restore_timeout": "seconds a start on the target may take before the migration rolls back",
    "migration.park_after": "worker_timeouts both workers of a failed migration may be silent "
    "before it stops holding the budget",
    "migration.min_residence": "seconds a job stays on a worker before any move (no thrashing)",
    "migration.move_downtime": "seconds a moved job is expected not to run (measured), a cost of a move",
    "migration.restore_cpu": "CPU-seconds a restore is expected to take from the target's jobs (measured)",
    "migration.learn_costs": "learn move_downtime and restore_cpu from the moves made, per backend "
    "(worker label specon.io/runtime) and job size (memory request), the figures above as the prior",
    "migration.cost_prior_weight": "how many measured moves the prior counts as when learning costs",
    "migration.max_push": "a moved job may go ahead of a job on the target (shortest first) only if it "
    "needs at most this share of that job's remaining work",
    "migration.dry_run": "decide and record migrations but never touch a container",
    "migration.mode": "checkpoint: the job contract (SIGTERM, save, resume); criu: Docker's CRIU "
    "checkpoint/restore of the whole process (Docker backend; falls back to checkpoint where CRIU "
    "cannot work); the job label specon.io/migration-mode overrides it",
    "priority": "Priority on the node: CPU weights among a worker's containers (specon.policy.priority)",
    "priority.rule": choices_doc(RULES.values()),
    **section_docs("priority", RULES.values()),
    "gpu": "Priority on a GPU: which jobs sharing a GPU run, by the priority rule's weights (docs/gpu.md)",
    "gpu.mechanism": "freeze: the top `concurrency` jobs run, the others are frozen (memory kept); "
    "mps: MPS thread percentages by weight at each start; both: the two; none: plain time-slicing",
    "gpu.concurrency": "jobs running at once on one GPU (freeze, both)",
    "gpu.quantum": "seconds a job switched in runs at least before another displaces it",
    "gpu.memory_headroom": "share of a GPU's memory kept free; frozen jobs that would leave less are "
    "suspended to their checkpoint, lowest weight first, and resumed when due and their memory fits",
    "gpu.mps_min_percentage": "smallest CUDA_MPS_ACTIVE_THREAD_PERCENTAGE a job starts with (mps, both)",
    "messaging": "Agent <-> manager messaging (SPEC §7)",
    "messaging.heartbeat_interval": "seconds between an agent's heartbeats",
    "messaging.worker_timeout": "a worker without a heartbeat this long is unreachable",
    "messaging.max_body_bytes": "largest message the manager accepts",
    "messaging.max_containers_per_heartbeat": "containers one heartbeat may report",
    "messaging.prune_after": "forget workers and finished containers unseen for this many worker_timeouts",
    "recovery": "Restoring jobs that run nowhere: lost hosts, crashed or stopped copies (SPEC §6.5)",
    "recovery.enabled": "restore every unfinished job that runs nowhere from its newest checkpoint",
    "recovery.after": "seconds a worker may be silent before it is lost and its jobs are restored elsewhere "
    "(at least worker_timeout)",
    "recovery.backoff": "seconds before a job's second recovery attempt; doubles with each attempt",
    "recovery.max_backoff": "longest wait between two recovery attempts of one job",
    "recovery.limit": "restarts of a job whose copy ended unfinished before it is left failed",
    "recovery.evacuate_taints": "taint keys of a reclaim notice: a worker carrying one is drained at once",
    "recovery.evacuate_deadline": "seconds after a reclaim notice by which each job on the worker is saved",
    "recovery.evacuate_cordoned": "drain a cordoned worker (node.kubernetes.io/unschedulable), no deadline",
}
