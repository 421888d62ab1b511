"""Runtime backends: one small interface (``base.Runtime``) and its implementations.

- ``base``: the interface, the job spec, the container states and the runtime errors;
- ``volume``: the shared volume's layout and records (``owner.json``, spec, exits, the lock);
- ``owners``: the owner-record code of the backends that run jobs on a host of their own
  (write-ahead records, never twice, host checks, stop and forget), shared by ``local`` and
  ``docker``;
- ``saving``: the save skeleton every backend shares;
- ``local``: jobs as process groups in per-worker CPU budgets on this machine;
- ``docker``: one worker per Docker engine, jobs as containers;
- ``kubernetes``: one worker per node, jobs as pods;
- ``gpu``: the worker's GPUs through NVML, mapped onto its containers by host PID.

The Docker and Kubernetes backends import their client libraries only in their own
subpackages (import contracts in pyproject.toml). The in-memory runtime for tests is
``specon.testing.fake_runtime``; nothing outside the tests may import it (``make imports``).
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
