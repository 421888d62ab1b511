"""The policy file: what specon decides and when (``apiVersion: specon/v1alpha1``).

- ``sections``: the schema, one frozen dataclass per section, with the defaults and paper mode
  (the choices of ``monitor.classifier`` and ``priority.rule``, and their sub-sections, are
  built from the registries of ``specon.policy.classifier`` and ``specon.policy.priority.rules``);
- ``policy_file``: loading, validation (every problem at once) and writing YAML;
- ``yaml12``: the one YAML loader and dumper (YAML 1.2 scalars).

The public names are re-exported here: ``from specon.config import Policy, load_policy``.
The daemons' operational settings (how long, how often) are ``specon.daemon.settings``.
"""

from specon.config.policy_file import (
    MODES,
    PolicyError,
    default_policy,
    load_policy,
    metric_pattern,
    parse_policy,
    policy_from_dict,
    policy_to_dict,
    policy_to_yaml,
)
from specon.config.sections import (
    API_VERSION,
    DOCS,
    KIND,
    PAPER_OVERRIDES,
    PLUGGABLE,
    Aggregate,
    ClassifierName,
    DurationFrom,
    FormatName,
    MessagingConfig,
    MigrationConfig,
    MigrationMode,
    Mode,
    MonitorConfig,
    Normalize,
    PlacementConfig,
    Policy,
    PriorityConfig,
    PriorityRule,
    ProgressConfig,
    RebalanceConfig,
    RebalanceMode,
    RebalanceWhen,
    RecoveryConfig,
    ScoreMode,
    StaleHandling,
    Weights,
    peer_priority,
)

__all__ = [
    "API_VERSION",
    "DOCS",
    "KIND",
    "MODES",
    "PAPER_OVERRIDES",
    "PLUGGABLE",
    "Aggregate",
    "ClassifierName",
    "DurationFrom",
    "FormatName",
    "MessagingConfig",
    "MigrationConfig",
    "MigrationMode",
    "Mode",
    "MonitorConfig",
    "Normalize",
    "PlacementConfig",
    "Policy",
    "PolicyError",
    "PriorityConfig",
    "PriorityRule",
    "ProgressConfig",
    "RebalanceConfig",
    "RebalanceMode",
    "RebalanceWhen",
    "RecoveryConfig",
    "ScoreMode",
    "StaleHandling",
    "Weights",
    "default_policy",
    "load_policy",
    "metric_pattern",
    "parse_policy",
    "peer_priority",
    "policy_from_dict",
    "policy_to_dict",
    "policy_to_yaml",
]
