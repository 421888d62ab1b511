"""The GPU sharing on real processes: the local runtime freezes and thaws real jobs (cgroup
freezer, else ``SIGSTOP``) and suspends and resumes them through their checkpoints.

No GPU is needed, nor used: each job is a plain Python loop counting steps, and what NVML would
say of it (the GPU and the memory it holds) is a sample built by the test. What is checked is
what the sharing does to the processes: the job of lower priority stops counting while the
other runs, the switch waits for the quantum, ``close`` lets everything run, and a job
suspended for memory comes back on this worker with exactly its steps.
"""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator, Collection, Mapping
from dataclasses import replace
from pathlib import Path

import pytest
from specon_agent.gpu_share import GpuShare
from specon_agent.priority import Running
from test_runtime_local import last_step, records, wait_for

from specon.config import PriorityConfig
from specon.config.sections import GpuShareConfig
from specon.model import ContainerId
from specon.runtime import JobPaths, JobSpec, LocalCluster, LocalRuntime
from specon.runtime.gpu.sample import GpuSample
from specon.wire.gpu import GpuDevice, GpuUse

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(90)]

GB = 1 << 30
SRPT = PriorityConfig(rule="srpt")
A, B = ContainerId("a"), ContainerId("b")

# A job per the job contract: a step every ``pause`` seconds, a checkpoint on SIGTERM, and
# on start the newest complete checkpoint's step. Given a third argument, a file, it is held:
# it trains its steps and then on until that file exists (the test releases it once it has
# suspended it), finishing at the first step boundary after that.
JOB = r"""
import json, os, signal, sys, time
from pathlib import Path
from specon import checkpoint

steps, pause = int(sys.argv[1]), float(sys.argv[2])
release = Path(sys.argv[3]) if len(sys.argv) > 3 else None
progress = os.environ["SPECON_PROGRESS_FILE"]
ckdir = Path(os.environ["SPECON_CHECKPOINT_DIR"])
stop = False

def on_term(signum, frame):
    global stop
    stop = True

signal.signal(signal.SIGTERM, on_term)

def log(record):
    with open(progress, "a") as fh:
        fh.write(json.dumps(record) + "\n")

loaded = checkpoint.load(ckdir)
step = json.loads(loaded[1])["step"] if loaded else 0
log({"event": "resumed" if loaded else "started", "step": step})
while step < steps or (release is not None and not release.exists()):
    if stop:
        checkpoint.write(ckdir, step, json.dumps({"step": step}).encode())
        sys.exit(75)
    time.sleep(pause)
    step += 1
    log({"step": step, "loss": 1.0 / step})
log({"event": "finished", "step": step})
Path(os.environ["SPECON_DONE_FILE"]).write_text("done")
"""


@pytest.fixture
async def rt(tmp_path: Path) -> AsyncIterator[LocalRuntime]:
    cluster = LocalCluster(tmp_path / "volume", [1.0])
    try:
        yield cluster["w0"]
    finally:
        assert await cluster.teardown()


def spec(
    tmp_path: Path, job: ContainerId, steps: int, pause: float = 0.02, release: Path | None = None
) -> JobSpec:
    """The loop as job ``job``; ``release``: held past ``steps`` until that file exists."""
    script = tmp_path / "job.py"
    if not script.exists():
        script.write_text(JOB)
    argv: tuple[str, ...] = (sys.executable, str(script), str(steps), str(pause))
    argv += (str(release),) if release is not None else ()
    return JobSpec(id=job, command=argv, steps=steps)


async def counts(
    rt: LocalRuntime, *jobs: str, moving: Collection[str], steps: int = 5, timeout: float = 20.0
) -> dict[str, int]:
    """How many steps each job made from now until each job of ``moving`` made more than
    ``steps`` (polled: however slow the machine, at most ``timeout`` seconds)."""
    before = {j: last_step(rt, j) for j in jobs}

    def made() -> dict[str, int]:
        return {j: last_step(rt, j) - before[j] for j in jobs}

    await wait_for(
        lambda: all(made()[j] > steps for j in moving), f"{', '.join(moving)} to make {steps} steps", timeout
    )
    return made()


class Worker:
    """What the agent would hand the sharing each tick: the running jobs (weighed by srpt
    on the steps left they declared) and a fake NVML sample of one 80 GB GPU."""

    def __init__(self, rt: LocalRuntime, share: GpuShare, totals: Mapping[ContainerId, int]) -> None:
        self.rt, self.share, self.totals = rt, share, totals
        self.memory: dict[ContainerId, int] = {}
        self.left: dict[ContainerId, int] = {}  # declared steps left, as the rule reads them

    async def tick(self) -> None:
        alive = {c.id: c for c in await self.rt.list_containers() if c.alive}
        running = []
        for cid, c in alive.items():
            total = self.totals[cid]
            running.append(Running(id=cid, started=c.started_at, step=total - self.left[cid], total=total))
        device = GpuDevice(index=0, uuid="GPU-0", name="NVIDIA H100 80GB HBM3", memory_total=80 * GB)
        uses = {cid: GpuUse(devices=(0,), memory=self.memory[cid]) for cid in alive}
        await self.share.step(
            self.rt.now(),
            sample=GpuSample(devices=(device,), containers=uses),
            running=running,
            fair={},
            priority=SRPT,
            specs={cid: c.spec for cid, c in alive.items()},
        )


@pytest.mark.serial
async def test_the_job_of_higher_priority_runs_the_other_is_frozen_and_they_switch_after_the_quantum(
    rt: LocalRuntime, tmp_path: Path
) -> None:
    for job in (A, B):
        await rt.start(spec(tmp_path, job, 100_000))
    await wait_for(lambda: last_step(rt, A) > 3 and last_step(rt, B) > 3, "both jobs to count")
    quantum = 3.0
    share = GpuShare(rt, GpuShareConfig(quantum=quantum), grace=10.0)
    worker = Worker(rt, share, {A: 100_000, B: 100_000})
    worker.memory = {A: GB, B: GB}
    worker.left = {A: 10, B: 900}  # A has the least work left

    await worker.tick()
    assert share.states == {A: "running", B: "frozen"}
    made = await counts(rt, A, B, moving=[A])
    assert made[A] > 5 and made[B] == 0  # B's counter stands still, A's runs on

    worker.left = {A: 900, B: 5}  # now B is the shorter one, but A has run under a quantum
    running_since = share.jobs[A].since  # its start: it has run since
    assert rt.now() - running_since < quantum
    await worker.tick()
    assert share.states == {A: "running", B: "frozen"}  # A keeps its quantum
    await wait_for(lambda: rt.now() - running_since > quantum, "the quantum to pass")
    await worker.tick()
    assert share.states == {A: "frozen", B: "running"}
    made = await counts(rt, A, B, moving=[B])
    assert made[A] == 0 and made[B] > 5

    await share.close()  # the agent leaves: both run again
    made = await counts(rt, A, B, moving=[A, B])
    assert made[A] > 5 and made[B] > 5
    assert share.counters.freezes == 2 and share.counters.thaws == 2


async def test_a_job_suspended_for_memory_resumes_with_exactly_its_steps(
    rt: LocalRuntime, tmp_path: Path
) -> None:
    total = 80
    gate = tmp_path / "release-b"  # B is held until it has been suspended
    await rt.start(spec(tmp_path, A, 100_000))
    await rt.start(spec(tmp_path, B, total, release=gate))
    await wait_for(lambda: last_step(rt, B) >= 10, "B to make ten steps")
    state_file = tmp_path / "agent" / "monitor.gpu.json"
    state_file.parent.mkdir()
    share = GpuShare(rt, replace(GpuShareConfig(), quantum=0.0), state_file=state_file, grace=10.0)
    worker = Worker(rt, share, {A: 100_000, B: total})
    worker.memory = {A: 50 * GB, B: 30 * GB}  # 80 GB of 80: B cannot stay beside A
    worker.left = {A: 10, B: 900}

    await worker.tick()
    assert share.states[B] == "suspended" and share.counters.suspends == 1
    assert B not in {c.id for c in await rt.list_containers() if c.alive}  # it exited
    suspended_at = last_step(rt, B)
    kept = json.loads(state_file.read_text())["jobs"]["b"]
    assert kept["state"] == "suspended" and kept["checkpoint"].endswith(".json")
    gate.touch()  # suspended: once resumed, B may finish (at step 80, or where it stopped if later)
    made = await counts(rt, A, B, moving=[A])
    assert made[A] > 5 and made[B] == 0

    await rt.stop(A, grace=5.0)  # A is done with the GPU
    await worker.tick()
    assert share.states == {B: "running"} and share.counters.resumes == 1
    await wait_for(JobPaths.of(rt.root, B).done.exists, "B to finish")
    recs = records(rt, B)
    end = max(total, suspended_at)  # 80 unless a loaded machine held B past it
    assert [r["step"] for r in recs if "loss" in r] == list(range(1, end + 1))  # none lost, none twice
    assert recs[-1] == {"event": "finished", "step": end}
    assert {"event": "resumed", "step": suspended_at} in recs
    assert json.loads(state_file.read_text())["jobs"] == {}
