"""The versioned policy file (``apiVersion: specon/v1alpha1``): schema and defaults.

Every knob of SPEC.md is a field here, with the SPEC default. ``mode: paper`` swaps in
the values that reproduce the paper's printed behaviour (``PAPER_OVERRIDES``) before the
file's own values are applied, so a paper-mode file may still override single knobs.

Loading is: parse YAML -> validate (every error, with its path, in one message) ->
fill defaults -> frozen ``Policy``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from specon.model import Direction

API_VERSION = "specon/v1alpha1"
KIND = "Policy"

Mode = Literal["default", "paper"]
ClassifierName = Literal["specon", "robust"]
Normalize = Literal["max", "previous", "none"]
Aggregate = Literal["mean", "last"]
StaleHandling = Literal["skip", "zero"]
FormatName = Literal["auto", "jsonl", "csv", "text"]
ScoreMode = Literal["count", "per_capacity"]
RebalanceMode = Literal["balanced", "paper", "off"]
RebalanceWhen = Literal["all_migrated", "always"]
DurationFrom = Literal["converged", "migrated"]


@dataclass(frozen=True, slots=True)
class ProgressConfig:
    """How a job's progress log is read (SPEC §2)."""

    format: FormatName = "auto"
    metric: str = "loss"
    direction: Direction = Direction.MINIMIZE
    # Free-text pattern; must have one group capturing the number. ``{metric}`` is
    # replaced by the escaped metric name.
    regex: str = r"(?i)\b{metric}\b\s*[:=]?\s*([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|nan|[-+]?inf(?:inity)?)"
    # Longer lines are skipped (counted) rather than buffered without bound.
    max_line_bytes: int = 1 << 20


@dataclass(frozen=True, slots=True)
class RobustConfig:
    """Knobs of the ``robust`` classifier (used only when ``classifier: robust``)."""

    # Exponential smoothing factor applied to E before differencing (1 = no smoothing).
    smoothing: float = 0.3
    # k-of-n hysteresis: a category step needs k of the last n ticks to agree.
    k: int = 3
    n: int = 4
    # Ticks of history for the trend test (least-squares slope of smoothed E).
    trend_window: int = 6
    # Relative rise of smoothed E over the trend window that counts as diverging.
    diverge_threshold: float = 0.05


@dataclass(frozen=True, slots=True)
class MonitorConfig:
    """Algorithm 1, the agent's container monitor (SPEC §3)."""

    classifier: ClassifierName = "specon"
    interval: float = 30.0  # Δ, seconds
    alpha: float = 0.01
    normalize: Normalize = "max"
    aggregate: Aggregate = "mean"
    stale: StaleHandling = "skip"
    stale_ticks: int = 10
    # At least this many PC+WC containers must share the worker for a request (SPEC §3.3).
    request_min_active: int = 1
    robust: RobustConfig = field(default_factory=RobustConfig)


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
    max_migrations_per_container: int = 1


@dataclass(frozen=True, slots=True)
class RebalanceConfig:
    """Algorithm 3, rebalancing (SPEC §5)."""

    mode: RebalanceMode = "balanced"
    when: RebalanceWhen = "all_migrated"
    duration_from: DurationFrom = "converged"
    max_rebalances_per_container: int = 1


@dataclass(frozen=True, slots=True)
class MigrationConfig:
    """The save/restore state machine and its limits (SPEC §6)."""

    max_concurrent: int = 2
    max_concurrent_per_worker: int = 1
    grace_period: float = 30.0  # seconds between SIGTERM and SIGKILL on save
    dry_run: bool = False


@dataclass(frozen=True, slots=True)
class MessagingConfig:
    """Agent <-> manager messaging (SPEC §7)."""

    heartbeat_interval: float = 5.0
    worker_timeout: float = 20.0
    max_body_bytes: int = 1 << 20


@dataclass(frozen=True, slots=True)
class Policy:
    """A complete, validated, defaulted policy."""

    api_version: str = API_VERSION
    kind: str = KIND
    mode: Mode = "default"
    progress: ProgressConfig = field(default_factory=ProgressConfig)
    monitor: MonitorConfig = field(default_factory=MonitorConfig)
    placement: PlacementConfig = field(default_factory=PlacementConfig)
    rebalance: RebalanceConfig = field(default_factory=RebalanceConfig)
    migration: MigrationConfig = field(default_factory=MigrationConfig)
    messaging: MessagingConfig = field(default_factory=MessagingConfig)


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
    "placement": {"score": "count"},
    "rebalance": {"mode": "paper", "when": "all_migrated"},
}
