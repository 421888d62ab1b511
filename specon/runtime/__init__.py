"""Runtime backends: one small interface (``base.Runtime``) and its implementations.

``local`` runs jobs as process groups in per-worker CPU budgets on this machine; ``fake``
is an in-memory runtime for tests. Docker and Kubernetes backends import their client
libraries only in their own modules.
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
from specon.runtime.fake import FakeClock, FakeRuntime, FakeVolume, JobScript
from specon.runtime.local import LocalCluster, LocalRuntime
from specon.runtime.volume import JobPaths

__all__ = [
    "AlreadyRunning",
    "ContainerInfo",
    "ContainerState",
    "FakeClock",
    "FakeRuntime",
    "FakeVolume",
    "JobPaths",
    "JobScript",
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
