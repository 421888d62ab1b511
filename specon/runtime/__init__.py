"""Runtime backends: one small interface (``base.Runtime``) and its implementations.

``local`` runs jobs as process groups in per-worker CPU budgets on this machine. Docker and
Kubernetes backends import their client libraries only in their own modules (import contracts
in pyproject.toml). ``fake`` is an in-memory runtime for tests: they import
``specon.testing.fake_runtime`` directly, and nothing outside the tests may (``make imports``).
"""

from specon.runtime.base import (
    AlreadyRunning,
    ContainerInfo,
    ContainerState,
    JobSpec,
    NoSuchContainer,
    Runtime,
    RuntimeFailure,
    SaveFailed,
    SaveResult,
    StartFailed,
    StillRunning,
    WorkerUsage,
)
from specon.runtime.local.backend import LocalRuntime
from specon.runtime.local.cluster import LocalCluster
from specon.runtime.volume import JobPaths

__all__ = [
    "AlreadyRunning",
    "ContainerInfo",
    "ContainerState",
    "JobPaths",
    "JobSpec",
    "LocalCluster",
    "LocalRuntime",
    "NoSuchContainer",
    "Runtime",
    "RuntimeFailure",
    "SaveFailed",
    "SaveResult",
    "StartFailed",
    "StillRunning",
    "WorkerUsage",
]
