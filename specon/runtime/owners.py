"""The owner record of a job, as the backends that run jobs on one host of their own keep it.

``owner.json`` on the shared volume (``specon.runtime.volume.Owner``) names the worker that
runs a job, the host that can verify the run (a boot id, a Docker engine) and, once the run
exists, its pid or container. ``OwnerRecords`` is that record's code, shared by
``LocalRuntime`` (a run is a process group) and ``DockerRuntime`` (a run is a container):

- **write-ahead**: a provisional record (no pid, no handle) is written before the launch and
  completed after it, so a runtime that dies in between leaves a record that names the run;
  the next read completes it from the run itself (``_find_run``) or, if it never started,
  finds it not alive;
- **never twice**: a record of another host cannot be verified here and counts as running,
  so no start proceeds while any host may run the job, unless the run's launcher recorded
  its exit on the volume, or the record is this worker's own from an earlier boot (the run
  ended with it); start, forget and clearing the record hold the job's ``flock``
  (``volume.job_lock``);
- **never the wrong run**: a container is acted on only where its record names this worker
  *and* this host (a pid or container id of another host means nothing here), and a record
  is removed only while it still names the run that ended.

A backend supplies hooks: how a provisional record is completed, how liveness on this host is
checked, and how a run is signalled, waited for and killed; the generic ``RunT`` is what it
acts on (the owner record for the local backend, the container for Docker). Events are named
in the backend's namespace (``_EVENTS``).
"""

from __future__ import annotations

import abc
import contextlib
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import ClassVar, Generic, ParamSpec, TypeVar

import structlog

from specon.model import ContainerId, WorkerId
from specon.runtime.base import (
    AlreadyFinished,
    AlreadyRunning,
    ContainerInfo,
    ContainerState,
    NoSuchContainer,
    RuntimeFailure,
    SaveFailed,
    StartFailed,
    StillRunning,
    Supersede,
)
from specon.runtime.saving import unrecoverable
from specon.runtime.volume import CorruptRecordError, JobPaths, Owner, job_lock

__all__ = ["OwnerRecords", "run_fields"]

log = structlog.get_logger()

RunT = TypeVar("RunT")
P = ParamSpec("P")
R = TypeVar("R")


class OwnerRecords(abc.ABC, Generic[RunT]):
    """Owner records on the volume, and the start/stop/forget checks built on them."""

    _EVENTS: ClassVar[str]  # the backend's event namespace, e.g. "specon.runtime"
    _HOST_NOUN: ClassVar[str]  # what ``Owner.host`` is, in messages: "boot", "engine"
    # What ``stop_all`` steps over to stop the rest (a run that resists, an engine error).
    _STOP_ALL_SKIPS: ClassVar[tuple[type[Exception], ...]] = ()

    root: Path
    _worker: WorkerId
    _host: str  # the identity this runtime records and can verify runs of
    _busy: dict[ContainerId, ContainerState]  # saves and stops in flight

    # -- hooks -------------------------------------------------------------------------------
    @abc.abstractmethod
    async def sleep(self, seconds: float) -> None: ...

    @abc.abstractmethod
    def now(self) -> float: ...

    @abc.abstractmethod
    def _find_run(self, owner: Owner) -> Owner | None:
        """The complete record of a provisional one of this host, from its run; None if no
        run of it exists (never launched, or gone)."""

    @abc.abstractmethod
    def _alive_here(self, owner: Owner) -> bool:
        """Whether the run ``owner`` (of this host) still runs."""

    @abc.abstractmethod
    async def _run(self, paths: JobPaths, owner: Owner) -> RunT:
        """What to act on for a job this runtime owns; ``NoSuchContainer`` if there is none."""

    @abc.abstractmethod
    async def _stoppable(self, run: RunT) -> bool:
        """Whether ``stop`` has something to signal."""

    @abc.abstractmethod
    async def _still_running(self, run: RunT) -> bool:
        """Whether ``forget`` must refuse (checked with the job's lock held)."""

    @abc.abstractmethod
    async def _report(self, paths: JobPaths, run: RunT) -> ContainerInfo | None:
        """The job's listing entry; None if its records cannot be read."""

    @abc.abstractmethod
    async def _send_term(self, run: RunT) -> None:
        """SIGTERM the run (never a process that is no longer the job's)."""

    @abc.abstractmethod
    async def _wait_ended(self, run: RunT, timeout: float) -> bool:
        """Wait until the run has exited; False on timeout."""

    @abc.abstractmethod
    async def _kill(self, paths: JobPaths, run: RunT) -> None:
        """SIGKILL the run and wait for it; ``RuntimeFailure`` if it survives."""

    @abc.abstractmethod
    async def _live_jobs(self) -> list[ContainerId]:
        """The jobs running on this host that ``stop_all`` stops."""

    async def _discard(self, run: RunT) -> None:
        """Remove what is left of a forgotten run (nothing, unless the backend keeps some)."""

    async def _offload(self, fn: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
        """Run a call that may block (reading a record, asking an engine); inline unless a
        backend sends it to a thread."""
        return fn(*args, **kwargs)

    # -- the record ----------------------------------------------------------------------------
    def _read_owner(self, paths: JobPaths) -> Owner | None:
        """``owner.json``, a provisional record of this host completed from its run when that
        exists: a runtime that died between the launch and the full record leaves a job that a
        later start must see running. ``CorruptRecordError`` if unreadable."""
        owner = paths.read_owner()
        if owner is None or not owner.provisional or owner.host != self._host:
            return owner
        full = self._find_run(owner)
        if full is None:
            return owner  # never launched, or gone: ``_alive`` says no
        with contextlib.suppress(OSError):  # a full volume: completed again at the next read
            paths.write_owner(full)
        log.warning(
            f"{self._EVENTS}.owner_completed", worker=self._worker, container=paths.job, **run_fields(full)
        )
        return full

    def _alive(self, owner: Owner) -> bool:
        if owner.host != self._host:
            # This worker's own record from an earlier boot (or engine) names a run that ended
            # with it: this worker is this host now. Another worker's run cannot be verified
            # from here: assume it runs (never run twice).
            return owner.worker != self._worker
        return self._alive_here(owner)

    def _exit_recorded(self, paths: JobPaths, owner: Owner) -> bool:
        """A run of another host whose launcher recorded its exit on the volume has ended: the
        record is the run's own word, readable from any host (a crash, an OOM kill)."""
        if owner.host == self._host:
            return False
        try:
            return paths.exit_of(owner.run_id) is not None
        except OSError:
            return False

    def _write_ahead(self, job: ContainerId, paths: JobPaths, *, fence: bool = True) -> Owner:
        """Record a new run, in a new generation (``fence``), before it exists (``StartFailed``
        if that fails: nothing started). Call with the job's lock held.

        ``AlreadyFinished`` if the job finished by the time its new generation is on record:
        a superseded copy on a host out of reach may complete between the start's first look
        and the bump; one that completes after the bump is fenced before its ``finished``
        record (and a start after it resumes at the end and only records it)."""
        try:
            before = paths.read_owner()
        except CorruptRecordError:
            before = None
        try:
            generation = paths.bump_generation() if fence else paths.read_generation()
            owner = Owner(self._worker, uuid.uuid4().hex, self.now(), self._host, generation=generation)
            paths.write_owner(owner)
        except (OSError, CorruptRecordError) as exc:
            raise StartFailed(job, f"cannot record the owner: {exc}") from exc
        if paths.finished():  # the run that finished keeps its record (its host lists it ended)
            with contextlib.suppress(OSError):
                if before is not None:
                    paths.write_owner(before)
                else:
                    paths.clear_owner()
            raise AlreadyFinished(job, "already finished (done marker or final progress record)")
        return owner

    def _abandon(self, paths: JobPaths, owner: Owner, kill: Callable[[], object]) -> None:
        """A launched run that cannot be recorded: SIGKILLed (``kill``; it runs no more code
        once the signal is sent) and its provisional record removed (an unlink works on a full
        volume), so a dead run's record refuses no later start anywhere."""
        with contextlib.suppress(OSError):
            kill()
        with contextlib.suppress(OSError):
            self._clear_owner(paths, owner)

    def _clear_owner(self, paths: JobPaths, owner: Owner) -> None:
        """Remove owner.json if it still records *this* run (call with the lock held)."""
        try:
            current = paths.read_owner()
        except CorruptRecordError:
            current = None
        if current is not None and current.run_id == owner.run_id:
            paths.clear_owner()

    def _locked(self, paths: JobPaths) -> contextlib.AbstractAsyncContextManager[None]:
        return job_lock(paths, self.sleep)

    # -- checks --------------------------------------------------------------------------------
    def _refuse_running(self, paths: JobPaths, *, supersede: Supersede = False) -> Owner | None:
        """Start's check, with the job's lock held: ``AlreadyRunning`` while any host may run
        it, ``StartFailed`` if its record cannot tell. ``supersede``: the manager has taken the
        worker of that run for lost (True: whichever it is); a run of it, seen alive here or
        not (network-namespace hosts share one kernel and ``/proc``), is fenced instead (the
        start's new generation makes it stale; a local launcher kills it) and the start goes
        on: returned, so a backend that can reach it ends it first. A run of any other worker
        refuses it: that worker may be alive and well."""
        try:
            owner = self._read_owner(paths)
        except CorruptRecordError as exc:
            raise StartFailed(paths.job, f"cannot tell whether it runs elsewhere: {exc}") from exc
        if owner is None or not self._alive(owner) or self._exit_recorded(paths, owner):
            return None
        lost = supersede is True or supersede == owner.worker
        if lost and (owner.host != self._host or owner.worker != self._worker):
            log.warning(f"{self._EVENTS}.superseded", worker=self._worker, container=paths.job,
                        stale_worker=owner.worker, stale_generation=owner.generation)  # fmt: skip
            return owner
        where = f"pid {owner.pid}" if owner.pid is not None else owner.host
        raise AlreadyRunning(paths.job, f"already running on worker {owner.worker} ({where})")

    def _owned_here(self, paths: JobPaths) -> Owner:
        """The job's record if it names this worker and this host, else ``NoSuchContainer``."""
        try:
            owner = self._read_owner(paths)
        except CorruptRecordError as exc:
            raise NoSuchContainer(paths.job, str(exc)) from exc
        if owner is None or owner.worker != self._worker:
            where = "nowhere" if owner is None else f"on worker {owner.worker}"
            raise NoSuchContainer(paths.job, f"not on worker {self._worker} (it runs {where})")
        if owner.host != self._host:
            # Its pid or container id means nothing here: acting on it could hit another run.
            raise NoSuchContainer(paths.job, f"recorded by another host ({self._HOST_NOUN} {owner.host})")
        return owner

    async def _require(self, container_id: ContainerId) -> tuple[JobPaths, Owner, RunT]:
        try:
            paths = JobPaths.of(self.root, container_id)
        except ValueError as exc:
            raise NoSuchContainer(container_id, str(exc)) from exc
        owner = await self._offload(self._owned_here, paths)
        return paths, owner, await self._run(paths, owner)

    # -- stopping ------------------------------------------------------------------------------
    async def _terminate(self, paths: JobPaths, run: RunT, grace: float, *, saving: bool = False) -> bool:
        """SIGTERM, then SIGKILL past ``grace``; True if it had to be killed. ``saving``: a
        run that may not be killed (no checkpoint would survive) is left running, and
        ``SaveFailed`` says so."""
        await self._send_term(run)
        if await self._wait_ended(run, grace):
            return False
        if saving and await unrecoverable(paths.checkpoints):
            log.error(f"{self._EVENTS}.save_failed", container=paths.job, left_running=True)
            raise SaveFailed(
                paths.job,
                f"no checkpoint verified within {grace:g}s and every earlier one is corrupt;"
                " killing it would lose its progress, so it was left running",
            )
        await self._kill(paths, run)
        return True

    async def stop(self, container_id: ContainerId, *, grace: float) -> ContainerInfo:
        paths, _owner, run = await self._require(container_id)
        if container_id in self._busy:
            raise RuntimeFailure(container_id, f"a {self._busy[container_id].value} is in progress")
        if await self._stoppable(run):
            self._busy[container_id] = ContainerState.STOPPING
            try:
                await self._terminate(paths, run, grace)
            finally:
                self._busy.pop(container_id, None)
            log.info(f"{self._EVENTS}.stopped", worker=self._worker, container=container_id)
        info = await self._report(paths, run)
        if info is None:
            raise NoSuchContainer(container_id, "its records vanished while stopping")
        return info

    async def stop_all(self, *, grace: float = 0.0) -> int:
        """Stop every job running here (tests, demo teardown); returns how many."""
        stopped = 0
        for job in await self._live_jobs():
            if job in self._busy:
                continue
            with contextlib.suppress(*self._STOP_ALL_SKIPS):
                await self.stop(job, grace=grace)
                stopped += 1
        return stopped

    async def forget(self, container_id: ContainerId) -> None:
        paths, owner, run = await self._require(container_id)
        async with self._locked(paths):
            if container_id in self._busy or await self._still_running(run):
                raise StillRunning(container_id, "cannot forget a running container; stop or save it first")
            await self._offload(self._clear_owner, paths, owner)
            await self._discard(run)
        log.info(f"{self._EVENTS}.forgotten", worker=self._worker, container=container_id)


def run_fields(owner: Owner) -> dict[str, object]:
    """The run's pid or container handle, for a log event."""
    fields: dict[str, object] = {}
    if owner.pid is not None:
        fields["pid"] = owner.pid
    if owner.handle is not None:
        fields["handle"] = owner.handle
    return fields
