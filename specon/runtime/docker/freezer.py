"""Freezing a Docker job where it stands, and the host PIDs of each job's processes.

- **freeze/thaw** are the engine's ``pause``/``unpause``: the cgroup freezer, so every process
  of the container stops at once and keeps its memory, GPU memory included (measured on an
  H100: the other job sharing the GPU had its full rate within 0.05 s). Idempotent; a job
  that is being saved or stopped is left alone (the save thaws it: a frozen container never
  receives SIGTERM); an absent container is False, logged once, never an exception. runc
  gives up a pause when the cgroup stays FREEZING through its short retry loop (a process
  busy in the kernel on a loaded host: "unable to freeze"); that pause is tried again.
- **pids**: each running or paused job's processes as this host numbers them, which is how
  NVML names the processes using a GPU: read from the container's cgroup (``cgroup.procs``,
  no engine call), else the engine's ``top``.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Mapping

import docker
import docker.errors
import structlog
from docker.models.containers import Container
from tenacity import AsyncRetrying, retry_if_exception, stop_after_attempt, wait_exponential

from specon.model import ContainerId
from specon.runtime.base import ContainerState
from specon.runtime.docker.cgroup import ContainerCounters
from specon.runtime.docker.engine import init_pid, live, top_pids

__all__ = ["LIVE", "RUNNING", "Freezer"]

log = structlog.get_logger()

# A container that runs, frozen or not; one that runs (``engine.live`` lists either without
# inspecting a container: every agent tick does).
LIVE = ("running", "paused")
RUNNING = ("running",)
# runc's words when the freezer cgroup did not settle in FROZEN in time: transient.
TRANSIENT_PAUSE = "unable to freeze"
PAUSE_ATTEMPTS = 4


def transient(exc: BaseException) -> bool:
    """A pause that failed only because the freezer did not settle in time."""
    return isinstance(exc, docker.errors.APIError) and TRANSIENT_PAUSE in str(exc)


class Freezer:
    """The engine's pause and PIDs for one ``DockerRuntime`` (``busy``: its saves and stops)."""

    def __init__(self, client: docker.DockerClient, busy: Mapping[ContainerId, ContainerState]) -> None:
        self._client = client
        self._busy = busy
        self._procs = ContainerCounters()
        self._missing: set[ContainerId] = set()  # logged once until seen again

    async def set(self, container_id: ContainerId, frozen: bool) -> bool:
        """Pause (``frozen``) or unpause the job's container; True when it is so now."""
        verb = "freeze" if frozen else "thaw"
        if container_id in self._busy:
            log.info(
                f"specon.docker.{verb}_skipped",
                container=container_id,
                reason=f"a {self._busy[container_id].value} is in progress",
            )
            return False
        c = (await asyncio.to_thread(live, self._client, LIVE)).get(container_id)
        if c is None:
            if container_id not in self._missing:
                self._missing.add(container_id)
                log.info(f"specon.docker.{verb}_skipped", container=container_id, reason="not running here")
            return False
        self._missing.discard(container_id)
        if (c.status == "paused") == frozen:
            return True
        call = self._client.api.pause if frozen else self._client.api.unpause
        try:
            async for attempt in AsyncRetrying(
                retry=retry_if_exception(transient),
                stop=stop_after_attempt(PAUSE_ATTEMPTS),
                wait=wait_exponential(multiplier=0.1, max=1.0),
                reraise=True,
            ):
                with attempt:
                    await asyncio.to_thread(call, c.id)
        except docker.errors.APIError as exc:  # NotFound included: it ended meanwhile
            # Lost a race with another pause, unpause or the end of the run: say what is true now.
            now = (await asyncio.to_thread(live, self._client, LIVE)).get(container_id)
            if now is not None and (now.status == "paused") == frozen:
                return True
            log.warning(f"specon.docker.{verb}_failed", container=container_id, error=str(exc))
            return False
        log.info("specon.docker.frozen" if frozen else "specon.docker.thawed", container=container_id)
        return True

    async def pids(self) -> dict[ContainerId, frozenset[int]]:
        """Host PIDs of each running or paused job's processes (jobs whose PIDs cannot be
        told here are left out)."""
        running = await asyncio.to_thread(live, self._client, LIVE)
        return await asyncio.to_thread(self._pids, running)

    def _pids(self, running: Mapping[ContainerId, Container]) -> dict[ContainerId, frozenset[int]]:
        self._procs.keep(str(c.id) for c in running.values())
        out = {}
        for job, c in running.items():
            found = self._procs.procs(str(c.id), functools.partial(init_pid, self._client, c))
            if found is None:  # the agent in another pid or cgroup namespace, a remote engine
                found = top_pids(c)
            if found:
                out[job] = found
        return out
