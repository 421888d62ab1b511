"""Freezing a local job where it stands, every process of it at once, and thawing it.

Three ways, the first that holds the job:

* cgroup v2: its group ``<worker>/job-<id>`` (the CPU group, ``cgroup_v2``): ``1`` into
  ``cgroup.freeze``, done when ``cgroup.events`` says ``frozen 1``;
* cgroup v1: its group in the ``freezer`` hierarchy, ``<freezer>/<own>/<path>/job-<id>``,
  joined at start like its CPU group: ``FROZEN`` into ``freezer.state``, done when it reads
  ``FROZEN`` (it reads ``FREEZING`` until every task stopped);
* else ``SIGSTOP`` to its process group (the launcher's, which every process the job starts
  inherits unless it leaves it), done when each member is stopped (``T`` in ``/proc``);
  ``SIGCONT`` thaws. A process that left the group with ``setsid`` escapes this one.

A job counts as held by a group only when its launcher (the process group's leader) is in
it: one launched into its worker's group because its own could not be made is signalled.
Each wait is bounded (``timeout``); a freeze that does not complete is undone and reported.
Frozen jobs keep their memory, GPU memory included (INFRA.md, "GPU"). A frozen job takes no
signal but ``SIGKILL`` (v2 and ``SIGSTOP``; v1 not even that) until thawed, so the runtime
thaws a job before it signals it to save or stop; a job's group is thawed again when a job
starts into it, so one that ended frozen never leaves a frozen trap behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import structlog

from specon.model import ContainerId
from specon.runtime.local.cgroup_files import JOB_PREFIX, read_value, write_value
from specon.runtime.local.cgroup_v1 import CpuGroup
from specon.runtime.local.procfs import PROC, group_members, own_cgroups, read_stat

log = structlog.get_logger()

FreezeMode = Literal["auto", "cgroup", "signal"]
How = Literal["cgroup-v2", "cgroup-v1", "signal"]
FREEZE_TIMEOUT = 2.0  # seconds a freeze or thaw may take before it is undone and reported
_POLL_S = 0.002


def detect_v1_freezer(*, root: Path, proc: Path = PROC) -> Path | None:
    """Where this process's groups go in a writable cgroup-v1 ``freezer`` hierarchy; None
    without one."""
    top = root / "freezer"
    if not (top / "cgroup.procs").exists() or (root / "cgroup.controllers").exists():
        return None
    if not os.access(top, os.W_OK):
        return None
    return top / own_cgroups(proc=proc).get("freezer", "/").lstrip("/")


@dataclass(frozen=True, slots=True)
class FreezeResult:
    """What a freeze or thaw did: whether the job is now as asked, how, and in what time."""

    ok: bool
    how: How
    seconds: float
    changed: bool = True  # False: it already was as asked (nothing written or signalled)
    error: str | None = None


def _stopped(pids: Iterable[int], proc: Path) -> bool:
    """True when each of ``pids`` is stopped, a zombie, or gone."""
    for pid in pids:
        st = read_stat(pid, proc=proc)
        if st is not None and not st.zombie and st.state not in {"T", "t"}:
            return False
    return True


class Freezer:
    """Freezes and thaws one worker's jobs (``mode``: ``auto``, the cgroup that holds the job
    else signals; ``cgroup``, never signals; ``signal``, always signals)."""

    def __init__(
        self,
        *,
        v2_worker: Path | None = None,
        v1_worker: CpuGroup | None = None,
        mode: FreezeMode = "auto",
        proc: Path = PROC,
        timeout: float = FREEZE_TIMEOUT,
    ) -> None:
        self.v2_worker = v2_worker  # the worker's unified group: jobs' groups are its children
        self.v1_worker = v1_worker  # the worker's group in the v1 freezer hierarchy
        self.mode: FreezeMode = mode
        self.timeout = timeout
        self._proc = proc

    # -- where a job is held ----------------------------------------------------------------
    def job_dir(self, job: ContainerId) -> tuple[How, Path] | None:
        """The freezer group of ``job`` (it may not exist), by kind; None: signals only."""
        if self.mode == "signal":
            return None
        if self.v2_worker is not None:
            return "cgroup-v2", self.v2_worker / (JOB_PREFIX + job)
        if self.v1_worker is not None:
            return "cgroup-v1", self.v1_worker.cpu_dir / (JOB_PREFIX + job)
        return None

    def _holding(self, job: ContainerId, pgid: int | None) -> tuple[How, Path] | None:
        found = self.job_dir(job)
        if found is None or not found[1].is_dir():
            return None
        if pgid is not None and pgid not in CpuGroup(found[1], found[1], 1).pids():
            return None  # launched into its worker's group instead
        return found

    def v1_entry(self, job: ContainerId) -> tuple[Path, Path] | None:
        """The v1 freezer ``cgroup.procs`` a new process of ``job`` joins (its group, made
        here and thawed), with its worker's as the fallback; None without a v1 freezer."""
        if self.v1_worker is None:
            return None
        own = self.v1_worker.child(JOB_PREFIX + job)
        own.make()
        self.reset(job)
        return own.procs_files[0], self.v1_worker.procs_files[0]

    def reset(self, job: ContainerId) -> None:
        """Thaw ``job``'s group without waiting (a job starting into the group of one that
        ended frozen would be frozen at once)."""
        found = self.job_dir(job)
        if found is None:
            return
        how, path = found
        name, thawed = ("cgroup.freeze", "0") if how == "cgroup-v2" else ("freezer.state", "THAWED")
        with contextlib.suppress(OSError):
            if read_value(path / name) != thawed:
                write_value(path / name, thawed)

    # -- freeze, thaw, ask ------------------------------------------------------------------
    def frozen(self, job: ContainerId, pgid: int | None) -> bool:
        """True when ``job`` is frozen (or freezing) by its group or stopped by signals."""
        held = self._holding(job, pgid)
        with contextlib.suppress(OSError):
            if held is not None and not self._thawed_setting(*held):
                return True
        if pgid is None:
            return False
        members = group_members([pgid], proc=self._proc)[pgid]
        return bool(members) and _stopped(members, self._proc)

    async def freeze(self, job: ContainerId, pgid: int) -> FreezeResult:
        """Freeze every process of ``job`` (process group ``pgid``); idempotent."""
        t0 = time.monotonic()
        held = self._holding(job, pgid)
        if held is not None:
            try:
                return await self._freeze_group(*held, t0)
            except OSError as exc:  # the group vanished, or the write was refused
                return self._result(False, held[0], t0, f"cannot freeze {held[1]}: {exc}")
        if self.mode == "cgroup":
            why = "no freezer cgroup holds it and signals are off (mode cgroup)"
            return self._result(False, "signal", t0, why)
        try:
            os.killpg(pgid, signal.SIGSTOP)
        except ProcessLookupError:
            return self._result(False, "signal", t0, f"process group {pgid} is gone")
        members = group_members([pgid], proc=self._proc)[pgid]
        if not await self._until(lambda: _stopped(members, self._proc)):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGCONT)
            return self._result(False, "signal", t0, f"group {pgid} not stopped within {self.timeout:g}s")
        return self._result(True, "signal", t0)

    async def _freeze_group(self, how: How, path: Path, t0: float) -> FreezeResult:
        if how == "cgroup-v2":
            write_value(path / "cgroup.freeze", "1")
            done = await self._until(lambda: "frozen 1" in read_value(path / "cgroup.events"))
            undo: tuple[str, str] = ("cgroup.freeze", "0")
        else:
            write_value(path / "freezer.state", "FROZEN")
            done = await self._until(lambda: read_value(path / "freezer.state") == "FROZEN")
            undo = ("freezer.state", "THAWED")
        if not done:
            write_value(path / undo[0], undo[1])
            return self._result(False, how, t0, f"{path} not frozen within {self.timeout:g}s; thawed again")
        return self._result(True, how, t0)

    async def thaw(self, job: ContainerId, pgid: int | None) -> FreezeResult:
        """Let ``job`` run again; a job that is not frozen is left alone (ok, unchanged)."""
        t0 = time.monotonic()
        held = self._holding(job, pgid)
        changed = False
        how: How = "signal"
        if held is not None:
            how, path = held
            name, thawed = ("cgroup.freeze", "0") if how == "cgroup-v2" else ("freezer.state", "THAWED")
            try:
                if read_value(path / name) != thawed:
                    write_value(path / name, thawed)
                    changed = True
                    if not await self._until(lambda: self._thawed(how, path)):
                        return self._result(False, how, t0, f"{path} still frozen after {self.timeout:g}s")
            except OSError as exc:  # the group vanished with its job: nothing left frozen there
                if path.is_dir():
                    return self._result(False, how, t0, f"cannot thaw {path}: {exc}")
        # Signals too, whatever froze it: a job stopped while signals were the way stays
        # stopped after its group thaws. Its group lists its processes; else scan /proc.
        if pgid is None:
            members: set[int] = set()
        elif held is not None:
            members = CpuGroup(held[1], held[1], 1).pids()
        else:
            members = group_members([pgid], proc=self._proc)[pgid]
        if pgid is not None and members and any(self._stopped_one(p) for p in members):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGCONT)
            changed, how = True, "signal" if held is None else how
        return self._result(True, how, t0, changed=changed)

    @staticmethod
    def _thawed_setting(how: How, path: Path) -> bool:
        """Whether the group is set to run (``cgroup.freeze`` 0, ``freezer.state`` THAWED)."""
        if how == "cgroup-v2":
            return read_value(path / "cgroup.freeze") == "0"
        return read_value(path / "freezer.state") == "THAWED"

    @staticmethod
    def _thawed(how: How, path: Path) -> bool:
        if how == "cgroup-v2":
            return "frozen 0" in read_value(path / "cgroup.events")
        return read_value(path / "freezer.state") == "THAWED"

    def _stopped_one(self, pid: int) -> bool:
        st = read_stat(pid, proc=self._proc)
        return st is not None and st.state in {"T", "t"}

    async def _until(self, check: Callable[[], bool]) -> bool:
        """Poll ``check`` (a read error counts as not yet) until true or ``timeout``; whether
        it came true."""
        deadline = time.monotonic() + self.timeout
        while True:
            with contextlib.suppress(OSError):
                if check():
                    return True
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(_POLL_S)

    @staticmethod
    def _result(
        ok: bool, how: How, t0: float, error: str | None = None, *, changed: bool = True
    ) -> FreezeResult:
        return FreezeResult(ok, how, time.monotonic() - t0, changed, error)


def report(action: Literal["freeze", "thaw"], result: FreezeResult, **context: object) -> bool:
    """Log what a freeze or thaw did (``specon.runtime.frozen``/``thawed``, or ``..._failed``;
    a thaw that changed nothing is not logged); whether it succeeded."""
    done = "frozen" if action == "freeze" else "thawed"
    fields = {**context, "how": result.how, "seconds": round(result.seconds, 4)}
    if not result.ok:
        log.warning(f"specon.runtime.{action}_failed", **fields, error=result.error)
    elif result.changed or action == "freeze":
        log.info(f"specon.runtime.{done}", **fields)
    return result.ok


def report_refusal(action: Literal["freeze", "thaw"], why: str | None, **context: object) -> bool:
    """Log why a job was not frozen or thawed (``specon.runtime.freeze_refused``); False."""
    log.warning(f"specon.runtime.{action}_refused", **context, reason=why)
    return False
