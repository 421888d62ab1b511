"""Several local workers on one machine sharing one volume: the embedded default's cluster.

Each worker is a ``LocalRuntime`` with its own CPU budget (cgroup or affinity); the demo,
the embedded daemons and the tests drive them together and tear them all down at the end.
"""

from __future__ import annotations

import asyncio
import math
import os
import secrets
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType

import structlog

from specon.model import WorkerId
from specon.runtime.base import RuntimeFailure
from specon.runtime.local.backend import LocalRuntime
from specon.runtime.local.cgroups import CGROUP_ROOT, Mode
from specon.runtime.local.warm import WarmSpec

log = structlog.get_logger()


class LocalCluster:
    """W local workers sharing one volume root: for the demo and tests.

    ``teardown`` kills every job and removes every cgroup; use it in a ``finally`` (or as
    ``async with``) so tests clean up after themselves even when they fail.
    """

    def __init__(
        self,
        root: Path,
        cpus: Sequence[float],
        *,
        name: str | None = None,
        budget: Mode = "auto",
        cgroup_parent: str = "specon",
        cgroup_root: Path = CGROUP_ROOT,
        warm: bool | WarmSpec = False,
    ) -> None:
        self.root = root
        self.name = name or f"c{os.getpid()}-{secrets.token_hex(3)}"
        self.runtimes: dict[WorkerId, LocalRuntime] = {}
        offset = 0
        try:
            for i, c in enumerate(cpus):
                wid = WorkerId(f"w{i}")
                self.runtimes[wid] = LocalRuntime(
                    root,
                    wid,
                    c,
                    cgroup_parent,
                    cluster=self.name,
                    budget=budget,
                    cgroup_root=cgroup_root,
                    affinity_offset=offset,
                    warm=warm,
                )
                offset += max(1, math.ceil(c))
        except BaseException:
            for rt in self.runtimes.values():
                rt.close()
            raise

    def __getitem__(self, worker: str) -> LocalRuntime:
        return self.runtimes[WorkerId(worker)]

    @property
    def workers(self) -> list[WorkerId]:
        return list(self.runtimes)

    async def warm_up(self, timeout: float = 60.0) -> bool:
        """Wait, at most ``timeout`` seconds, until every worker's warm interpreter has
        imported; True when all have (at once when there are none). Past it jobs start cold."""
        warm = [rt.warm for rt in self.runtimes.values() if rt.warm is not None]
        deadline = time.monotonic() + timeout
        while not all(w.ready for w in warm):
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(0.1)
        return True

    async def teardown(self) -> bool:
        """Kill every job of every worker and remove every cgroup; True when all is gone."""
        clean = True
        for rt in self.runtimes.values():
            try:
                await rt.stop_all()
            except RuntimeFailure as exc:
                log.error("specon.runtime.teardown_failed", worker=rt.worker, error=str(exc))
                clean = False
            clean = rt.close() and clean
        return clean

    async def __aenter__(self) -> LocalCluster:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.teardown()
