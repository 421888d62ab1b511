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
from collections.abc import Collection, Mapping
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


class Owners:
    """Each job's ``owner.json``, read again only when the file changed (it is replaced by a
    rename: a new inode): a listing, every agent tick, costs a ``stat`` per running job."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._seen: dict[ContainerId, tuple[tuple[int, int], Owner | None]] = {}

    def of(self, job: ContainerId) -> Owner | None:
        paths = JobPaths(self.root, job)
        try:
            st = paths.owner.stat()
            key = (st.st_ino, st.st_mtime_ns)
        except OSError:
            key = (0, 0)  # absent: runs nowhere
        cached = self._seen.get(job)
        if cached is not None and cached[0] == key:
            return cached[1]
        try:
            owner = paths.read_owner()
        except CorruptRecordError:
            owner = None  # unreadable: never a reason to kill (and read again next time)
            key = (-1, -1)
        self._seen[job] = (key, owner)
        return owner

    def keep(self, jobs: Collection[ContainerId]) -> None:
        for job in self._seen.keys() - set(jobs):
            del self._seen[job]


def stop_superseded(managed: Mapping[ContainerId, Container], owners: Owners) -> dict[ContainerId, Container]:
    """``managed`` without the running containers a newer start superseded, which are killed."""
    out = {}
    owners.keep(managed)
    for job, c in managed.items():
        if c.status == "running":
            owner = owners.of(job)
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
