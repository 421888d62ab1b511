"""A job's container left running on an engine after a newer start elsewhere superseded it.

When the manager takes a host for lost, the job's start on another engine supersedes the run
there (``Runtime.start(supersede=True)``): ``owner.json`` then names the new run, in a newer
generation (``specon.fence``). A job using ``jobkit`` stops at its next write; any other
container would run on. So when its engine's agent lists its containers again (the host came
back), a running container of a run the job's record no longer names, once fencing is in
force for the job, is killed at once (SIGKILL: a stale copy must not write a checkpoint on
its way out) and not listed: the manager's copy elsewhere is the job.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from pathlib import Path

import docker
import structlog
from docker.models.containers import Container

from specon.model import ContainerId
from specon.runtime.docker.recipe import LABEL_RUN
from specon.runtime.docker.standby import LABEL_STANDBY
from specon.runtime.volume import CorruptRecordError, JobPaths, Owner

log = structlog.get_logger("specon.docker")


def superseded(labels: Mapping[str, str], container_id: str, owner: Owner | None) -> bool:
    """Whether a running container (``labels``, ``container_id``) is a run ``owner`` (the
    job's record) has moved past: another run, recorded in a generation. A standby handed the
    job keeps its creation labels: its record names its container instead."""
    run = labels.get(LABEL_RUN)
    if owner is None or owner.generation is None or run is None or LABEL_STANDBY in labels:
        return False
    return run != owner.run_id and owner.handle != container_id


def stop_superseded(managed: Mapping[ContainerId, Container], root: Path) -> dict[ContainerId, Container]:
    """``managed`` without the running containers a newer start superseded, which are killed."""
    out = {}
    for job, c in managed.items():
        if c.status == "running":
            try:
                owner = JobPaths(root, job).read_owner()
            except CorruptRecordError:
                owner = None  # unreadable: never a reason to kill
            if superseded(c.labels or {}, str(c.id), owner):
                run = (c.labels or {}).get(LABEL_RUN)
                current = owner.run_id if owner else None
                log.warning("specon.docker.stale_copy_killed", container=job, handle=c.short_id, run=run,
                            current_run=current)  # fmt: skip
                with contextlib.suppress(docker.errors.APIError):  # gone meanwhile
                    c.kill()
                continue
        out[job] = c
    return out
