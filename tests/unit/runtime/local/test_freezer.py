"""The freezer against fake cgroup trees (the kernel's side played by a writer that updates
``cgroup.events`` / ``freezer.state`` as cgroupfs does) and, for signals, a real process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from specon.model import ContainerId
from specon.runtime.local.cgroup_v1 import CpuGroup
from specon.runtime.local.cgroups import CpuBudget
from specon.runtime.local.freezer import Freezer, detect_v1_freezer
from specon.runtime.local.procfs import read_stat

JOB = ContainerId("j1")
PGID = 5151


class Kernel:
    """Writes control files; ``stuck``: a freeze never completes (a task in D state)."""

    def __init__(self) -> None:
        self.stuck = False
        self.writes: list[tuple[str, str]] = []

    def write(self, path: Path, value: object) -> None:
        text = str(value)
        self.writes.append((path.name, text))
        path.write_text(text)
        if path.name == "cgroup.freeze":
            done = text == "0" or not self.stuck
            (path.parent / "cgroup.events").write_text(f"populated 1\nfrozen {int(text == '1' and done)}\n")
        if path.name == "freezer.state" and text == "FROZEN" and self.stuck:
            path.write_text("FREEZING")


@pytest.fixture
def kernel(monkeypatch: pytest.MonkeyPatch) -> Iterator[Kernel]:
    k = Kernel()
    monkeypatch.setattr("specon.runtime.local.freezer.write_value", k.write)
    yield k


def v2_job(tmp_path: Path, pgid: int = PGID) -> Path:
    job = tmp_path / "w0" / f"job-{JOB}"
    job.mkdir(parents=True)
    (job / "cgroup.procs").write_text(f"{pgid}\n{pgid + 1}\n")
    (job / "cgroup.freeze").write_text("0")
    (job / "cgroup.events").write_text("populated 1\nfrozen 0\n")
    return job


def v1_worker(tmp_path: Path, pgid: int = PGID) -> CpuGroup:
    worker = tmp_path / "freezer" / "w0"
    (worker / f"job-{JOB}").mkdir(parents=True)
    (worker / f"job-{JOB}" / "cgroup.procs").write_text(f"{pgid}\n")
    (worker / f"job-{JOB}" / "freezer.state").write_text("THAWED")
    return CpuGroup(worker, worker, 1)


async def test_v2_freeze_writes_cgroup_freeze_and_waits_for_the_event(tmp_path: Path, kernel: Kernel) -> None:
    job = v2_job(tmp_path)
    fz = Freezer(v2_worker=tmp_path / "w0")
    res = await fz.freeze(JOB, PGID)
    assert res.ok and res.how == "cgroup-v2" and res.seconds < 0.1
    assert (job / "cgroup.freeze").read_text() == "1" and fz.frozen(JOB, PGID)
    assert (await fz.freeze(JOB, PGID)).ok  # idempotent
    thawed = await fz.thaw(JOB, PGID)
    assert thawed.ok and thawed.changed and (job / "cgroup.freeze").read_text() == "0"
    assert not fz.frozen(JOB, PGID)
    again = await fz.thaw(JOB, PGID)  # not frozen: nothing written
    assert again.ok and not again.changed
    assert kernel.writes == [("cgroup.freeze", "1"), ("cgroup.freeze", "1"), ("cgroup.freeze", "0")]


async def test_a_freeze_that_does_not_complete_is_undone_and_reported(tmp_path: Path, kernel: Kernel) -> None:
    job = v2_job(tmp_path)
    kernel.stuck = True
    res = await Freezer(v2_worker=tmp_path / "w0", timeout=0.05).freeze(JOB, PGID)
    assert not res.ok and "not frozen within 0.05s; thawed again" in (res.error or "")
    assert (job / "cgroup.freeze").read_text() == "0"


async def test_v1_freeze_waits_for_frozen_and_undoes_a_stuck_freezing(tmp_path: Path, kernel: Kernel) -> None:
    worker = v1_worker(tmp_path)
    state = worker.cpu_dir / f"job-{JOB}" / "freezer.state"
    fz = Freezer(v1_worker=worker, timeout=0.05)
    res = await fz.freeze(JOB, PGID)
    assert res.ok and res.how == "cgroup-v1" and state.read_text() == "FROZEN" and fz.frozen(JOB, PGID)
    assert (await fz.thaw(JOB, PGID)).ok and state.read_text() == "THAWED"
    kernel.stuck = True
    res = await fz.freeze(JOB, PGID)
    assert not res.ok and state.read_text() == "THAWED"


async def test_a_job_outside_its_group_or_with_signals_forced_is_signalled(tmp_path: Path) -> None:
    v2_job(tmp_path, pgid=1)  # the group holds someone else: our job went to its worker's leaf
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], start_new_session=True)
    try:
        for fz in (Freezer(v2_worker=tmp_path / "w0"), Freezer(v2_worker=tmp_path / "w0", mode="signal")):
            res = await fz.freeze(JOB, child.pid)
            assert res.ok and res.how == "signal"
            st = read_stat(child.pid)
            assert st is not None and st.state == "T" and fz.frozen(JOB, child.pid)
            thawed = await fz.thaw(JOB, child.pid)
            assert thawed.ok and thawed.changed and not fz.frozen(JOB, child.pid)
            st = read_stat(child.pid)
            assert st is not None and st.state != "T"
            assert not (await fz.thaw(JOB, child.pid)).changed
    finally:
        os.killpg(child.pid, signal.SIGKILL)
        child.wait()


async def test_mode_cgroup_never_signals_and_a_gone_group_is_reported(tmp_path: Path) -> None:
    res = await Freezer(mode="cgroup").freeze(JOB, 2**22 + 7)
    assert not res.ok and "signals are off" in (res.error or "")
    res = await Freezer().freeze(JOB, 2**22 + 7)  # no such process group
    assert not res.ok and "is gone" in (res.error or "")
    thawed = await Freezer().thaw(JOB, None)  # an ended job: nothing to thaw
    assert thawed.ok and not thawed.changed


async def test_a_group_that_vanishes_mid_freeze_is_a_failure_not_a_crash(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    v2_job(tmp_path)

    def gone(path: Path, value: object) -> None:
        raise FileNotFoundError(2, "No such file or directory", str(path))

    monkeypatch.setattr("specon.runtime.local.freezer.write_value", gone)
    res = await Freezer(v2_worker=tmp_path / "w0").freeze(JOB, PGID)
    assert not res.ok and "cannot freeze" in (res.error or "")


def test_a_new_start_thaws_the_group_a_job_ended_frozen_in(tmp_path: Path, kernel: Kernel) -> None:
    job = v2_job(tmp_path)
    (job / "cgroup.freeze").write_text("1")
    Freezer(v2_worker=tmp_path / "w0").reset(JOB)
    assert (job / "cgroup.freeze").read_text() == "0"
    worker = v1_worker(tmp_path / "v1")
    (worker.cpu_dir / f"job-{JOB}" / "freezer.state").write_text("FROZEN")
    Freezer(v1_worker=worker).reset(JOB)
    assert (worker.cpu_dir / f"job-{JOB}" / "freezer.state").read_text() == "THAWED"


def test_detect_v1_freezer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    proc = tmp_path / "proc"
    (proc / "self").mkdir(parents=True)
    (proc / "self" / "cgroup").write_text("6:freezer:/outer\n0::/\n")
    assert detect_v1_freezer(root=tmp_path, proc=proc) is None
    (tmp_path / "freezer").mkdir()
    (tmp_path / "freezer" / "cgroup.procs").write_text("")
    assert detect_v1_freezer(root=tmp_path, proc=proc) == tmp_path / "freezer" / "outer"
    monkeypatch.setattr(os, "access", lambda *_a, **_k: False)
    assert detect_v1_freezer(root=tmp_path, proc=proc) is None


def test_budget_puts_jobs_into_their_v1_freezer_group_with_a_fallback(tmp_path: Path) -> None:
    root = tmp_path / "cgroup"
    (root / "freezer").mkdir(parents=True)
    (root / "freezer" / "cgroup.procs").write_text("")
    proc = tmp_path / "proc"
    (proc / "self").mkdir(parents=True)
    (proc / "self" / "cgroup").write_text("6:freezer:/\n")
    b = CpuBudget.establish(cpus=1, path=("specon", "w0"), mode="none", cgroup_root=root, proc=proc)
    worker = root / "freezer" / "specon" / "w0"
    assert b.freezer.v1_worker is not None and worker.is_dir()
    entry = b.entry(JOB)
    assert entry.files == ((str(worker / f"job-{JOB}" / "cgroup.procs"), str(worker / "cgroup.procs")),)
    signals = CpuBudget.establish(
        cpus=1, path=("specon", "w1"), mode="none", cgroup_root=root, proc=proc, freezing="signal"
    )
    assert signals.freezer.v1_worker is None and signals.entry(JOB).files == ()
    (worker / f"job-{JOB}").rmdir()
    assert b.close() and not (root / "freezer" / "specon").exists()


def test_job_pids_unite_the_process_group_and_the_jobs_cgroups(tmp_path: Path) -> None:
    b = CpuBudget.establish(cpus=1, path=("w0",), mode="none", cgroup_root=tmp_path, proc=Path("/proc"))
    me = os.getpgrp()
    got = b.job_pids({JOB: me})
    assert os.getpid() in got[JOB]
