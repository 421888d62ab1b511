"""Freezing real jobs through the real local runtime: a frozen job's CPU time and steps stop,
thawing resumes them, by the cgroup freezer where this machine has one (cgroup v1's
``freezer`` hierarchy here, as root) and by ``SIGSTOP``/``SIGCONT`` when forced; a frozen job
still saves (nothing lost) and stops; a job that ended frozen leaves no frozen trap.

The job is a small plain-Python loop (busy or sleeping steps, a checkpoint on SIGTERM,
resume from the newest one) that forks a helper process, as a data loader would: freezing
must hold every process of the job at once.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from test_runtime_local import last_step, records, wait_for

from specon import checkpoint
from specon.model import ContainerId, WorkerId
from specon.runtime import ContainerState, JobPaths, JobSpec, LocalRuntime
from specon.runtime.local.cgroups import CGROUP_ROOT, CLK_TCK, read_stat
from specon.runtime.local.freezer import FreezeMode, detect_v1_freezer

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(60)]

JOB = r"""
import json, os, signal, sys, time
from pathlib import Path
from specon import checkpoint

steps, busy = int(sys.argv[1]), sys.argv[2] == "busy"
progress = os.environ["SPECON_PROGRESS_FILE"]
ckdir = Path(os.environ["SPECON_CHECKPOINT_DIR"])
stop = False

def on_term(signum, frame):
    global stop
    stop = True

# A helper (a data loader) in the job's process group, busy too. Forked before the handler is
# set, it dies of SIGTERM from its first instruction: set after the fork, the handler could
# still be the helper's when the SIGTERM came (a helper not yet scheduled since the fork on a
# loaded machine, then frozen) and it outlived the stop's grace.
if os.fork() == 0:
    while True:
        if busy:
            t = time.process_time()
            while time.process_time() - t < 0.01:
                pass
        else:
            time.sleep(0.01)

signal.signal(signal.SIGTERM, on_term)

def log(record):
    with open(progress, "a") as fh:
        fh.write(json.dumps(record) + "\n")

loaded = checkpoint.load(ckdir)
step = json.loads(loaded[1])["step"] if loaded else 0
log({"event": "resumed" if loaded else "started", "step": step})
while step < steps and not stop:
    if busy:
        t = time.process_time()
        while time.process_time() - t < 0.01:
            pass
    else:
        time.sleep(0.01)
    step += 1
    log({"step": step, "loss": 1.0 / step})
checkpoint.write(ckdir, step, json.dumps({"step": step}).encode())
log({"event": "saved", "step": step})
"""


def spec(tmp_path: Path, job: str, *, busy: bool = True, steps: int = 10**6) -> JobSpec:
    script = tmp_path / "job.py"
    if not script.exists():
        script.write_text(JOB)
    argv = (sys.executable, str(script), str(steps), "busy" if busy else "sleep")
    return JobSpec(id=ContainerId(job), command=argv, steps=steps, model="loop")


async def cpu_seconds(rt: LocalRuntime, job: str) -> tuple[float, frozenset[int]]:
    """The job's processes' CPU seconds now (from /proc), and its pids (``LocalRuntime.pids``)."""
    pids = (await rt.pids())[ContainerId(job)]
    stats = [read_stat(p) for p in pids]
    return sum(s.cpu_ticks for s in stats if s is not None) / CLK_TCK, pids


def states(pids: frozenset[int]) -> set[str]:
    return {s.state for p in pids if (s := read_stat(p)) is not None}


def v1_freezer_or_skip() -> None:
    if os.geteuid() != 0:
        pytest.skip("the cgroup v1 freezer needs root")
    if detect_v1_freezer(root=CGROUP_ROOT) is None:
        pytest.skip(f"no writable cgroup v1 freezer hierarchy at {CGROUP_ROOT}/freezer (cgroup v2 only?)")


@pytest.fixture
async def runtime(tmp_path: Path) -> AsyncIterator[LocalRuntime]:
    rt = LocalRuntime(tmp_path / "volume", WorkerId("w0"), 1.0, cluster=f"fz{os.getpid()}")
    try:
        yield rt
    finally:
        await rt.stop_all(grace=5.0)
        assert rt.close(), "a cgroup was left behind"


@pytest.mark.parametrize("mode", ["cgroup", "signal"])
@pytest.mark.serial
async def test_a_frozen_job_stops_using_cpu_and_thawing_resumes_it(
    runtime: LocalRuntime, tmp_path: Path, mode: FreezeMode
) -> None:
    rt = runtime
    if mode == "cgroup":
        v1_freezer_or_skip()
    rt.budget.freezer.mode = mode
    job = ContainerId("busy")
    info = await rt.start(spec(tmp_path, job))
    await wait_for(lambda: last_step(rt, job) >= 3, "the job to step")
    _, pids = await cpu_seconds(rt, job)
    assert info.pid in pids and len(pids) >= 3  # the launcher, the job, its helper

    t0 = time.monotonic()
    assert await rt.freeze(job)
    took = time.monotonic() - t0
    print(f"freeze ({mode}) took {took * 1000:.1f} ms")
    assert took < 0.5
    assert rt.budget.freezer.frozen(job, info.pid)
    if mode == "signal":
        assert states(pids) <= {"T"}
    else:
        assert rt.budget.freezer.v1_worker is not None
        state = rt.budget.freezer.v1_worker.cpu_dir / f"job-{job}" / "freezer.state"
        assert state.read_text().strip() == "FROZEN"
    assert await rt.freeze(job)  # idempotent
    cpu0, step0 = (await cpu_seconds(rt, job))[0], last_step(rt, job)
    await asyncio.sleep(0.6)
    cpu1, step1 = (await cpu_seconds(rt, job))[0], last_step(rt, job)
    assert cpu1 - cpu0 <= 0.02 and step1 == step0, "a frozen job must not run"

    t0 = time.monotonic()
    assert await rt.thaw(job)
    print(f"thaw ({mode}) took {(time.monotonic() - t0) * 1000:.1f} ms")
    assert not rt.budget.freezer.frozen(job, info.pid)
    await asyncio.sleep(0.6)
    cpu2 = (await cpu_seconds(rt, job))[0]
    assert cpu2 - cpu1 > 0.1 and last_step(rt, job) > step1
    assert await rt.thaw(job)  # not frozen: a no-op


@pytest.mark.parametrize("mode", ["auto", "signal"])
async def test_a_frozen_job_saves_and_loses_nothing(
    runtime: LocalRuntime, tmp_path: Path, mode: FreezeMode
) -> None:
    rt = runtime
    rt.budget.freezer.mode = mode
    job = ContainerId("saver")
    await rt.start(spec(tmp_path, job, busy=False))
    await wait_for(lambda: last_step(rt, job) >= 5, "the job to step")
    assert await rt.freeze(job)
    frozen_at = last_step(rt, job)
    t0 = time.monotonic()
    saved = await rt.save(job, grace=10.0)
    assert not saved.forced and time.monotonic() - t0 < 5.0, "the frozen job must see its SIGTERM"
    assert saved.step == last_step(rt, job) >= frozen_at
    manifest = checkpoint.latest_complete(JobPaths.of(rt.root, job).checkpoints)
    assert manifest is not None and manifest.step == saved.step
    assert records(rt, job)[-1] == {"event": "saved", "step": saved.step}
    assert not await rt.freeze(job)  # it no longer runs here


async def test_a_frozen_job_stops_and_a_group_left_frozen_is_no_trap(
    runtime: LocalRuntime, tmp_path: Path
) -> None:
    rt = runtime
    job = ContainerId("stopper")
    await rt.start(spec(tmp_path, job, busy=False))
    await wait_for(lambda: last_step(rt, job) >= 2, "the job to step")
    assert await rt.freeze(job)
    t0 = time.monotonic()
    info = await rt.stop(job, grace=10.0)
    assert info.state in {ContainerState.EXITED, ContainerState.FAILED} and time.monotonic() - t0 < 5.0
    assert await rt.thaw(job)  # ended: nothing to thaw, and that is fine
    # A group left frozen (a job that ended while frozen, an agent that died meanwhile) is
    # thawed when the job starts into it again.
    found = rt.budget.freezer.job_dir(job)
    if found is not None and found[1].is_dir():
        how, path = found
        name, value = ("cgroup.freeze", "1") if how == "cgroup-v2" else ("freezer.state", "FROZEN")
        (path / name).write_text(value)
    await rt.forget(job)
    step = last_step(rt, job)
    await rt.start(spec(tmp_path, job, busy=False))
    await wait_for(lambda: last_step(rt, job) >= step + 3, "the restarted job to step", timeout=10.0)
