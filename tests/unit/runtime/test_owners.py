"""The owner-record code the local and Docker backends share (``specon.runtime.owners``).

A fake backend runs "processes" in memory on a volume in ``tmp_path``: the records, the lock
and the checks are the real ones, only the hooks (finding a run, liveness, signals) are fakes.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest
import structlog

from specon import checkpoint
from specon.model import ContainerId, WorkerId
from specon.runtime.base import (
    AlreadyFinished,
    AlreadyRunning,
    ContainerInfo,
    ContainerState,
    JobSpec,
    NoSuchContainer,
    RuntimeFailure,
    SaveFailed,
    StartFailed,
    StillRunning,
)
from specon.runtime.owners import OwnerRecords, run_fields
from specon.runtime.volume import ExitRecord, JobPaths, Owner

HOST = "boot-a"
JOB = ContainerId("j1")


@dataclass
class Proc:
    """A fake process: what it does with SIGTERM and SIGKILL, and which it got."""

    alive: bool = True
    ignores_term: bool = False
    survives_kill: bool = False
    signals: list[str] = field(default_factory=list)


class FakeBackend(OwnerRecords[Owner]):
    """Runs are pids of ``procs``; a provisional record's run is found in ``launched``."""

    _EVENTS = "specon.fake"
    _HOST_NOUN = "boot"
    _STOP_ALL_SKIPS = (NoSuchContainer,)

    def __init__(self, root: Path, worker: str = "w0", host: str = HOST) -> None:
        self.root = root
        self._worker = WorkerId(worker)
        self._host = host
        self._busy: dict[ContainerId, ContainerState] = {}
        self.procs: dict[int, Proc] = {}
        self.launched: dict[str, int] = {}  # run id -> pid, for provisional records
        self.found: list[str] = []  # the run ids _find_run was asked for
        self.discarded: list[Owner] = []

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(0)

    def now(self) -> float:
        return 100.0

    def launch(self, job: ContainerId, pid: int, **proc: bool) -> Owner:
        """A started run of ``job``: written ahead, then completed, as the backends do."""
        paths = JobPaths(self.root, job)
        paths.create()
        owner = replace(self._write_ahead(job, paths), pid=pid)
        paths.write_owner(owner)
        self.procs[pid] = Proc(**proc)
        return owner

    def _find_run(self, owner: Owner) -> Owner | None:
        self.found.append(owner.run_id)
        pid = self.launched.get(owner.run_id)
        return None if pid is None else replace(owner, pid=pid)

    def _alive_here(self, owner: Owner) -> bool:
        proc = self.procs.get(owner.pid or -1)
        return proc is not None and proc.alive

    async def _run(self, paths: JobPaths, owner: Owner) -> Owner:
        return owner

    async def _stoppable(self, run: Owner) -> bool:
        return self._alive(run)

    async def _still_running(self, run: Owner) -> bool:
        return self._alive(run)

    async def _discard(self, run: Owner) -> None:
        self.discarded.append(run)

    async def _report(self, paths: JobPaths, run: Owner) -> ContainerInfo | None:
        state = ContainerState.RUNNING if self._alive(run) else ContainerState.EXITED
        spec = JobSpec(id=paths.job, command=("true",))
        return ContainerInfo(paths.job, self._worker, spec, state, paths.progress, paths.checkpoints, 0.0)

    async def _live_jobs(self) -> list[ContainerId]:
        out = []
        for job in sorted(p.name for p in (self.root / "jobs").iterdir()):
            owner = JobPaths(self.root, ContainerId(job)).read_owner()
            if owner is not None and owner.host == self._host and self._alive(owner):
                out.append(ContainerId(job))
        return out

    async def _send_term(self, run: Owner) -> None:
        proc = self.procs[run.pid or -1]
        proc.signals.append("TERM")
        proc.alive = proc.alive and proc.ignores_term

    async def _wait_ended(self, run: Owner, timeout: float) -> bool:
        return not self._alive_here(run)

    async def _kill(self, paths: JobPaths, run: Owner) -> None:
        proc = self.procs[run.pid or -1]
        proc.signals.append("KILL")
        if proc.survives_kill:
            raise RuntimeFailure(paths.job, f"pid {run.pid} survived SIGKILL")
        proc.alive = False


@pytest.fixture
def rt(tmp_path: Path) -> FakeBackend:
    return FakeBackend(tmp_path)


def paths_of(rt: FakeBackend, job: str = JOB) -> JobPaths:
    return JobPaths(rt.root, ContainerId(job))


# -- the record ----------------------------------------------------------------------------


def test_a_new_run_is_written_ahead_as_a_provisional_record(rt: FakeBackend) -> None:
    paths = paths_of(rt)
    paths.create()
    owner = rt._write_ahead(JOB, paths)
    assert owner.provisional and owner.worker == "w0" and owner.host == HOST and owner.started_at == 100.0
    assert paths.read_owner() == owner
    assert not replace(owner, pid=7).provisional and not replace(owner, handle="c1").provisional


def test_a_run_that_cannot_be_recorded_is_never_started(rt: FakeBackend) -> None:
    with pytest.raises(StartFailed, match="cannot record the owner"):
        rt._write_ahead(JOB, paths_of(rt))  # no job directory: the write fails


def test_a_provisional_record_is_completed_from_its_run_and_written_back(rt: FakeBackend) -> None:
    paths = paths_of(rt)
    paths.create()
    provisional = rt._write_ahead(JOB, paths)
    rt.launched[provisional.run_id] = 42
    rt.procs[42] = Proc()
    with structlog.testing.capture_logs() as logs:
        owner = rt._read_owner(paths)
    assert owner == replace(provisional, pid=42) == paths.read_owner()
    completed = [(e["event"], e["container"], e["pid"]) for e in logs]
    assert completed == [("specon.fake.owner_completed", JOB, 42)]
    assert rt._alive(owner)
    rt.found.clear()
    assert rt._read_owner(paths) == owner and rt.found == []  # complete now: never looked up again


def test_a_provisional_record_whose_run_never_started_is_not_alive(rt: FakeBackend) -> None:
    paths = paths_of(rt)
    paths.create()
    provisional = rt._write_ahead(JOB, paths)
    with structlog.testing.capture_logs() as logs:
        owner = rt._read_owner(paths)
    assert owner == provisional == paths.read_owner() and logs == []
    assert owner is not None and not rt._alive(owner)
    rt._refuse_running(paths)  # a later start may go ahead


def test_a_record_of_another_host_is_never_completed_and_counts_as_running(tmp_path: Path) -> None:
    elsewhere, here = FakeBackend(tmp_path, "w1", host="boot-b"), FakeBackend(tmp_path)
    paths = paths_of(here)
    paths.create()
    provisional = elsewhere._write_ahead(JOB, paths)
    here.launched[provisional.run_id] = 42  # a pid of this host that happens to match
    assert here._read_owner(paths) == provisional and here.found == []
    assert here._alive(provisional)  # cannot be verified here: never run twice
    with pytest.raises(AlreadyRunning, match="already running on worker w1 \\(boot-b\\)"):
        here._refuse_running(paths)


def test_a_run_of_another_host_that_recorded_its_exit_no_longer_blocks_a_start(tmp_path: Path) -> None:
    elsewhere, here = FakeBackend(tmp_path, "w1", host="boot-b"), FakeBackend(tmp_path)
    owner = elsewhere.launch(JOB, 7)
    paths = paths_of(here)
    with pytest.raises(AlreadyRunning):
        here._refuse_running(paths)
    # Its launcher saw it crash and said so on the shared volume: any host may start it now.
    paths.append_exit(ExitRecord(owner.run_id, WorkerId("w1"), 7, 1, None, "exited", 100.0))
    here._refuse_running(paths)


def test_a_start_superseding_a_lost_hosts_run_goes_on_in_a_new_generation(tmp_path: Path) -> None:
    lost, here = FakeBackend(tmp_path, "w1", host="boot-b"), FakeBackend(tmp_path)
    owner = lost.launch(JOB, 7)
    paths = paths_of(here)
    assert owner.generation == 1 and paths.read_generation() == 1
    with pytest.raises(AlreadyRunning):
        here._refuse_running(paths)  # it may still run there: never twice
    with structlog.testing.capture_logs() as logs:
        here._refuse_running(paths, supersede=True)  # the manager took w1 for lost
    assert [(e["event"], e["stale_worker"], e["stale_generation"]) for e in logs] == [
        ("specon.fake.superseded", "w1", 1)
    ]
    assert here._write_ahead(JOB, paths).generation == 2  # the stale run's jobkit stops on it
    # Network-namespace hosts share one kernel: the lost worker's run is alive in this /proc.
    # It is superseded all the same when the start names its worker, never when it names another.
    again = FakeBackend(tmp_path)
    again.procs[42] = Proc()
    paths.write_owner(replace(owner, pid=42, host=again._host))
    with pytest.raises(AlreadyRunning):
        again._refuse_running(paths, supersede=WorkerId("w2"))  # w1 was not taken for lost
    assert again._refuse_running(paths, supersede=WorkerId("w1")) == replace(owner, pid=42, host=again._host)
    # This worker's own run, alive here, is never superseded.
    paths.write_owner(replace(owner, pid=42, worker=again._worker, host=again._host))
    with pytest.raises(AlreadyRunning):
        again._refuse_running(paths, supersede=True)


def test_this_workers_own_record_from_an_earlier_boot_has_ended(tmp_path: Path) -> None:
    # The host rebooted under the same worker id: the old boot's run died with it. It neither
    # shows as running for ever nor blocks a start (here or, once listed ended, anywhere).
    before, after = FakeBackend(tmp_path, host="boot-old"), FakeBackend(tmp_path)
    owner = before.launch(JOB, 42)
    assert not after._alive(owner)
    after._refuse_running(paths_of(after))
    other_worker = FakeBackend(tmp_path, "w1")
    assert other_worker._alive(owner)  # w1 cannot tell w0's boots apart: never run twice


def test_start_is_refused_while_the_job_runs_and_when_its_record_is_unreadable(rt: FakeBackend) -> None:
    owner = rt.launch(JOB, 42)
    paths = paths_of(rt)
    with pytest.raises(AlreadyRunning, match="already running on worker w0 \\(pid 42\\)"):
        rt._refuse_running(paths)
    rt.procs[42].alive = False
    rt._refuse_running(paths)
    paths.owner.write_text("{not json")
    with pytest.raises(StartFailed, match="cannot tell whether it runs elsewhere"):
        rt._refuse_running(paths)
    assert owner.pid == 42


def test_clearing_removes_only_the_record_of_that_run(rt: FakeBackend) -> None:
    first = rt.launch(JOB, 42)
    paths = paths_of(rt)
    second = rt.launch(JOB, 43)  # a later start wrote its own record
    rt._clear_owner(paths, first)
    assert paths.read_owner() == second
    paths.owner.write_text("{not json")
    rt._clear_owner(paths, second)  # unreadable: it may name another run, so it stays
    assert paths.owner.exists()
    paths.write_owner(second)
    rt._clear_owner(paths, second)
    assert paths.read_owner() is None
    rt._clear_owner(paths, second)  # nothing left: no error


def test_run_fields_name_what_identifies_the_run() -> None:
    owner = Owner(WorkerId("w0"), "r", 1.0, HOST)
    assert run_fields(owner) == {}
    assert run_fields(replace(owner, pid=3)) == {"pid": 3}
    assert run_fields(replace(owner, handle="c1")) == {"handle": "c1"}


# -- acting only on runs of this worker and host ---------------------------------------------


async def test_a_job_is_acted_on_only_where_its_record_names_this_worker_and_host(tmp_path: Path) -> None:
    w0, w1, other_host = FakeBackend(tmp_path), FakeBackend(tmp_path, "w1"), FakeBackend(tmp_path, host="b")
    with pytest.raises(NoSuchContainer, match="invalid job id"):
        await w0._require(ContainerId("../x"))
    with pytest.raises(NoSuchContainer, match="it runs nowhere"):
        await w0._require(JOB)
    owner = w0.launch(JOB, 42)
    assert await w0._require(JOB) == (paths_of(w0), owner, owner)
    with pytest.raises(NoSuchContainer, match="not on worker w1 \\(it runs on worker w0\\)"):
        await w1._require(JOB)
    with pytest.raises(NoSuchContainer, match="recorded by another host \\(boot boot-a\\)"):
        await other_host._require(JOB)  # same worker name, but its pid means nothing there
    paths_of(w0).owner.write_text("[]")
    with pytest.raises(NoSuchContainer, match=r"owner\.json"):
        await w0._require(JOB)


# -- stopping ------------------------------------------------------------------------------


async def test_stop_terminates_a_run_and_kills_only_one_that_ignores_sigterm(tmp_path: Path) -> None:
    rt = FakeBackend(tmp_path)
    rt.launch(ContainerId("polite"), 1)
    rt.launch(ContainerId("deaf"), 2, ignores_term=True)
    with structlog.testing.capture_logs() as logs:
        polite = await rt.stop(ContainerId("polite"), grace=0)
        deaf = await rt.stop(ContainerId("deaf"), grace=0)
    assert rt.procs[1].signals == ["TERM"] and rt.procs[2].signals == ["TERM", "KILL"]
    assert polite.state is deaf.state is ContainerState.EXITED and rt._busy == {}
    assert [e["event"] for e in logs] == ["specon.fake.stopped"] * 2
    again = await rt.stop(ContainerId("polite"), grace=0)  # ended: nothing to signal
    assert again.state is ContainerState.EXITED and rt.procs[1].signals == ["TERM"]


async def test_stop_refuses_a_job_whose_save_or_stop_is_in_progress(rt: FakeBackend) -> None:
    rt.launch(JOB, 42)
    rt._busy[JOB] = ContainerState.SAVING
    with pytest.raises(RuntimeFailure, match="a saving is in progress"):
        await rt.stop(JOB, grace=0)
    assert rt.procs[42].signals == []


async def test_a_run_that_survives_sigkill_is_reported_and_no_longer_busy(rt: FakeBackend) -> None:
    rt.launch(JOB, 42, ignores_term=True, survives_kill=True)
    with pytest.raises(RuntimeFailure, match="survived SIGKILL"):
        await rt.stop(JOB, grace=0)
    assert rt._busy == {}


async def test_a_save_leaves_running_a_job_whose_every_checkpoint_is_corrupt(rt: FakeBackend) -> None:
    rt.launch(JOB, 42, ignores_term=True)
    paths = paths_of(rt)
    checkpoint.write(paths.checkpoints, 3, b"state")
    for payload in paths.checkpoints.glob("*.bin"):
        payload.write_bytes(b"garbage")
    with structlog.testing.capture_logs() as logs, pytest.raises(SaveFailed, match="left running"):
        await rt._terminate(paths, rt._owned_here(paths), grace=0, saving=True)
    assert rt.procs[42].signals == ["TERM"] and rt.procs[42].alive
    assert [(e["event"], e["left_running"]) for e in logs] == [("specon.fake.save_failed", True)]


async def test_a_save_kills_past_the_grace_period_a_job_that_never_checkpointed(rt: FakeBackend) -> None:
    owner = rt.launch(JOB, 42, ignores_term=True)
    assert await rt._terminate(paths_of(rt), owner, grace=0, saving=True)  # killed: from step 0
    assert rt.procs[42].signals == ["TERM", "KILL"]
    rt.launch(ContainerId("j2"), 43)
    assert not await rt._terminate(paths_of(rt, "j2"), rt._owned_here(paths_of(rt, "j2")), grace=1)


async def test_stop_all_stops_the_live_jobs_of_this_host_that_are_not_busy(tmp_path: Path) -> None:
    rt = FakeBackend(tmp_path)
    for pid, job in enumerate(["a", "b", "c", "ended"], start=1):
        rt.launch(ContainerId(job), pid)
    rt.procs[4].alive = False
    rt._busy[ContainerId("b")] = ContainerState.SAVING
    elsewhere = FakeBackend(tmp_path, host="boot-b")
    elsewhere.launch(ContainerId("remote"), 1)  # pid 1 of another host: never signalled here
    assert await rt.stop_all() == 2
    assert [rt.procs[p].signals for p in (1, 2, 3, 4)] == [["TERM"], [], ["TERM"], []]
    assert elsewhere.procs[1].signals == []


async def test_stop_all_steps_over_a_job_that_left_since_it_was_listed(rt: FakeBackend) -> None:
    rt.launch(ContainerId("a"), 1)
    rt.launch(ContainerId("b"), 2)
    listed = await rt._live_jobs()

    async def gone_meanwhile() -> list[ContainerId]:
        paths_of(rt, "a").clear_owner()
        return listed

    rt._live_jobs = gone_meanwhile  # type: ignore[method-assign]
    assert await rt.stop_all() == 1
    assert rt.procs[2].signals == ["TERM"] and rt.procs[1].signals == []


# -- forgetting ----------------------------------------------------------------------------


async def test_forget_refuses_a_running_or_busy_job_and_clears_an_ended_one(rt: FakeBackend) -> None:
    owner = rt.launch(JOB, 42)
    with pytest.raises(StillRunning):
        await rt.forget(JOB)
    rt.procs[42].alive = False
    rt._busy[JOB] = ContainerState.STOPPING
    with pytest.raises(StillRunning):
        await rt.forget(JOB)
    del rt._busy[JOB]
    with structlog.testing.capture_logs() as logs:
        await rt.forget(JOB)
    assert paths_of(rt).read_owner() is None and rt.discarded == [owner]
    assert [e["event"] for e in logs] == ["specon.fake.forgotten"]
    with pytest.raises(NoSuchContainer):
        await rt.forget(JOB)


async def test_forget_waits_for_the_jobs_lock(tmp_path: Path) -> None:
    rt, other = FakeBackend(tmp_path), FakeBackend(tmp_path, "w1")
    rt.launch(JOB, 42)
    rt.procs[42].alive = False
    async with other._locked(paths_of(other)):
        forgetting = asyncio.create_task(rt.forget(JOB))
        for _ in range(20):
            await asyncio.sleep(0)
        assert not forgetting.done() and paths_of(rt).read_owner() is not None
    await forgetting
    assert paths_of(rt).read_owner() is None


def test_a_job_that_finished_before_its_new_generation_is_on_record_is_not_started(rt: FakeBackend) -> None:
    # A superseded copy on a host out of reach completes between the start's first look and
    # the bump: the start sees it once the generation is on record, and starts nothing.
    paths = paths_of(rt)
    paths.create()
    first = rt._write_ahead(JOB, paths)
    paths.done.write_text("{}")
    with pytest.raises(AlreadyFinished):
        rt._write_ahead(JOB, paths)
    assert paths.read_generation() == first.generation + 1  # any copy left is fenced
    assert paths.read_owner() == first  # the refused run's record is not left behind


def test_a_run_that_cannot_be_recorded_is_killed_and_leaves_no_record(rt: FakeBackend) -> None:
    # The volume filled between the write-ahead and the full record: the run is killed and
    # its provisional record goes, so a start on another worker is not refused by a dead run.
    paths = paths_of(rt)
    paths.create()
    ahead = rt._write_ahead(JOB, paths)
    killed: list[bool] = []
    rt._abandon(paths, ahead, lambda: killed.append(True))
    assert killed == [True] and paths.read_owner() is None
    FakeBackend(rt.root, "w1", host="boot-b")._refuse_running(paths)  # nothing refuses it now
