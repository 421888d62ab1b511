"""GPU sharing end to end, without a GPU: the real agent and manager processes of the embedded
cluster share one fake GPU among real local jobs.

The agent process imports ``pynvml`` as it would on a GPU machine; here the import finds
``fake_gpu/pynvml.py`` (first on the daemons' ``PYTHONPATH``), which plays the GPU described by
a JSON file the test writes: one device, and the GPU memory each job's process holds (found
by its ``SPECON_JOB_ID``). Everything else is real: the jobs are processes of the job contract
(``jobs/curve_job.py``, torch-free, asking for one GPU), frozen by the local runtime's cgroup
freezer, suspended to their checkpoints and restored by the agent's own runtime; the manager
reports what the agents say. Checked: the job with more work left is frozen while the other
runs (its log stands still), one that does not fit beside the other in GPU memory is
suspended and restored, and a job frozen when its agent is killed is thawed by the next agent
from its state file; every job ends with exactly its steps.

Where a scenario needs the short job still running (beside a frozen or suspended long one),
the short job is held (``curve_job.py --until-released``): it trains its steps and then on
until the test, having seen what it waits for, releases it; it then ends at step 160, or
where it was if a loaded machine held it longer. Its steps are checked exactly against
the total its ``finished`` record says it trained.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import re
import signal
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Collection
from pathlib import Path

import aiohttp
import pytest

from specon.config import PriorityConfig, default_policy, policy_to_yaml
from specon.embedded.cluster import EmbeddedCluster
from specon.model import ContainerId, Resources, WorkerId
from specon.runtime.base import JobSpec
from specon.testing.held_jobs import finished_steps, release
from specon.testing.progress_log import job_records

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.timeout(300)]

HERE = Path(__file__).parent
FAKE_GPU = HERE / "fake_gpu"  # holds pynvml.py
JOB = HERE / "jobs" / "curve_job.py"
GIB = 1 << 30
W0 = WorkerId("w0")
AGENT_HOST = "127.0.0.2"  # the embedded cluster's address of worker w0's agent
STEP_SECONDS = 0.05
SHORT, LONG = ContainerId("short"), ContainerId("long")
STEPS = {SHORT: 160, LONG: 320}  # srpt: the short one runs first
# What each job declares (JobSpec.steps, which srpt weighs): ten times what it trains, in the
# same ratio, so a held short job never trains past the total it declared (past it, the long
# job was seen to run beside it) and the rule's order stays settled however long it is held.
DECLARED = {jid: 10 * steps for jid, steps in STEPS.items()}
# CPU-seconds each step costs (``curve_job.py --step-cpu``): srpt weighs the steps left times
# the CPU per step the agent measured, at first over a dozen steps. A step that only sleeps
# costs ~0.2 ms and a checkpoint a few ms: one in a job's window can make the short job look
# as costly as the long one, which then ran first and ended first (a full suite, 4 Dec). 5 ms
# a step is over ten times what a checkpoint adds to a step there: the declared steps decide.
STEP_CPU = 0.005
TIGHT = int(0.7 * GIB)  # each job's GPU memory on the tight GPU (two do not fit in 1 GiB)


def job(jid: ContainerId, release: Path | None = None) -> JobSpec:
    """A ``curve_job.py`` run asking for one GPU; ``linear``: it keeps progressing. ``release``:
    held past its steps until that file exists (:func:`release`)."""
    argv: tuple[str, ...] = (sys.executable, str(JOB), "--steps", str(STEPS[jid]), "--curve", "linear")
    argv += ("--step-seconds", str(STEP_SECONDS), "--step-cpu", str(STEP_CPU), "--checkpoint-every", "40")
    argv += ("--until-released", str(release)) if release is not None else ()
    return JobSpec(id=jid, command=argv, steps=DECLARED[jid], model="linear", requests=Resources(gpu=1))


def write_gpu(path: Path, *, memory_total: int, jobs: dict[ContainerId, int]) -> None:
    """The fake GPU (``fake_gpu/pynvml.py``'s format), replaced atomically."""
    state = {
        "devices": [{"name": "NVIDIA H100 80GB HBM3", "memory_total": memory_total}],
        "jobs": {j: {"memory": mem, "sm": 90} for j, mem in jobs.items()},
    }
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(state))
    tmp.replace(path)


async def cluster_with_gpu(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *, memory_total: int, jobs: dict[ContainerId, int]
) -> AsyncIterator[EmbeddedCluster]:
    """One worker whose agent sees a fake GPU of ``memory_total`` bytes on which ``jobs`` hold
    their memory (``gpu_file``); srpt on the node, 1 s ticks and quanta, no migration (one worker)."""
    write_gpu(gpu_file(tmp_path), memory_total=memory_total, jobs=jobs)
    # The daemons inherit the environment (``EmbeddedCluster._spawn``); so do the jobs, harmlessly.
    monkeypatch.setenv("SPECON_FAKE_NVML", str(gpu_file(tmp_path)))
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join(p for p in (str(FAKE_GPU), os.environ.get("PYTHONPATH")) if p)
    )
    base = default_policy()
    policy = dataclasses.replace(
        base,
        monitor=dataclasses.replace(base.monitor, interval=1.0),
        priority=PriorityConfig(rule="srpt"),
        gpu=dataclasses.replace(base.gpu, mechanism="freeze", quantum=1.0),
        messaging=dataclasses.replace(base.messaging, heartbeat_interval=0.5, worker_timeout=10.0),
        migration=dataclasses.replace(base.migration, grace_period=10.0, min_residence=0.0),
    )
    path = tmp_path / "policy.yaml"
    path.write_text(policy_to_yaml(policy))
    async with EmbeddedCluster(tmp_path / "c", workers=1, cpus_per_worker=1.0, policy=path) as c:
        yield c


def gpu_file(tmp_path: Path) -> Path:
    return tmp_path / "gpu.json"


def gate(tmp_path: Path) -> Path:
    """The file that releases the held short job."""
    return tmp_path / "release-short"


@pytest.fixture
async def shared(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[EmbeddedCluster]:
    """An 80 GiB GPU: both jobs fit (1 GiB each), so the one of lower priority is frozen."""
    async for c in cluster_with_gpu(
        tmp_path, monkeypatch, memory_total=80 * GIB, jobs={SHORT: GIB, LONG: GIB}
    ):
        yield c


@pytest.fixture
async def tight(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[EmbeddedCluster]:
    """A 1 GiB GPU on which the short job holds 0.7 GiB; the test puts the long one there."""
    async for c in cluster_with_gpu(tmp_path, monkeypatch, memory_total=GIB, jobs={SHORT: TIGHT}):
        yield c


# -- what the test reads ----------------------------------------------------------------------
def records(c: EmbeddedCluster, jid: str) -> list[dict[str, object]]:
    return job_records(c.volume, jid)


def trained(c: EmbeddedCluster, jid: str) -> list[int]:
    return [int(str(r["step"])) for r in records(c, jid) if "loss" in r]


def events(c: EmbeddedCluster, jid: str) -> list[tuple[str, int]]:
    return [(str(r["event"]), int(str(r["step"]))) for r in records(c, jid) if "event" in r]


def finished(c: EmbeddedCluster, jid: str) -> bool:
    return any(e == "finished" for e, _ in events(c, jid))


def agent_events(c: EmbeddedCluster, name: str) -> list[dict[str, object]]:
    """The agent log's records of event ``name`` (every run of the agent: the file is appended)."""
    out = []
    for line in (c.logs / f"agent-{W0}.log").read_text(errors="replace").splitlines():
        if name in line:
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if rec.get("event") == name:
                out.append(rec)
    return out


async def metrics(c: EmbeddedCluster) -> dict[str, float]:
    """The agent's /metrics, sample name (with its labels) -> value."""
    async with (
        aiohttp.ClientSession() as s,
        s.get(c.agents[W0].url + "/metrics", timeout=aiohttp.ClientTimeout(total=5)) as r,
    ):
        text = await r.text()
    out = {}
    for line in text.splitlines():
        if m := re.match(r"^(specon_agent_gpu_\S+)\s+(\S+)$", line):
            out[m[1]] = float(m[2])
    return out


async def frozen_now(c: EmbeddedCluster) -> float:
    return (await metrics(c)).get('specon_agent_gpu_jobs{state="frozen"}', 0.0)


async def manager_gpu_states(c: EmbeddedCluster) -> dict[str, str]:
    """Each container's GPU state as the manager's status reports it (``running`` when none)."""
    st = await c.status()
    return {x.id: (x.gpu.state if x.gpu is not None else "running") for x in st.containers}


async def wait_for(cond: Callable[[], Awaitable[bool] | bool], what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = cond()
        if await got if isinstance(got, Awaitable) else got:
            return
        await asyncio.sleep(0.2)
    raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")


def assert_exact(c: EmbeddedCluster, jid: ContainerId, *, held: bool = False) -> None:
    """Every step trained exactly once, the state counting as many (``trained`` field): its
    ``STEPS``, or, ``held``, the total it finished with (never fewer)."""
    total = finished_steps(c.volume, jid)
    assert total == STEPS[jid] or (held and total > STEPS[jid]), f"{jid}: finished with {total} steps"
    steps = trained(c, jid)
    assert sorted(steps) == list(range(1, total + 1)), f"{jid}: steps {steps[:5]}...{steps[-5:]}"
    for r in records(c, jid):
        if "loss" in r:
            assert r["trained"] == r["step"], f"{jid} restored from the wrong state: {r}"
    assert events(c, jid)[-1] == ("finished", total)


# The jobs' steps take 24 s one after the other (STEPS x STEP_SECONDS); under the full suite's
# load (four workers on two cores) the two took 63 s from the release. A bound on a hang only.
FINISH_TIMEOUT = 150.0


async def both_finish(
    c: EmbeddedCluster, timeout: float = FINISH_TIMEOUT, *, held: Collection[str] = ()
) -> None:
    await wait_for(lambda: finished(c, SHORT) and finished(c, LONG), "both jobs to finish", timeout)
    for jid in (SHORT, LONG):
        assert_exact(c, jid, held=jid in held)


async def nothing_left_frozen(c: EmbeddedCluster) -> None:
    """The agent holds no job frozen (metrics, its state file) and the manager reports none."""
    await wait_for(lambda: frozen_now_is(c, 0.0), "the agent to hold no job frozen", timeout=10)
    assert "frozen" not in (await manager_gpu_states(c)).values()
    state = json.loads((c.volume / "agents" / W0 / "monitor.gpu.json").read_text())
    assert state["jobs"] == {}, state


async def frozen_now_is(c: EmbeddedCluster, value: float) -> bool:
    return await frozen_now(c) == value


# -- the scenarios ----------------------------------------------------------------------------
# srpt weighs steps left by each job's CPU per step since its first step here (its start-up not
# included: test_a_short_job_arriving_beside_a_long_one_runs_first); the scenarios submit the
# short job first so that the order is settled from the start.
async def test_the_job_with_more_work_left_is_frozen_while_the_other_runs(
    shared: EmbeddedCluster, tmp_path: Path
) -> None:
    c = shared
    await c.submit(job(SHORT, release=gate(tmp_path)), W0)  # held: it runs on through the window
    await c.submit(job(LONG), W0)

    async def long_frozen_everywhere() -> bool:
        return await frozen_now(c) == 1.0 and (await manager_gpu_states(c)).get(LONG) == "frozen"

    await wait_for(long_frozen_everywhere, "the long job to be frozen (agent and manager)", timeout=30)
    assert (await metrics(c))["specon_agent_gpu_freezes_total"] >= 1
    assert (await manager_gpu_states(c)).get(SHORT) == "running"
    # Frozen: its log stands still while the short job trains on (a window of 1.5 s at least,
    # and as long as the short job takes to train 10 steps on a loaded machine).
    long_at, short_at = len(trained(c, LONG)), len(trained(c, SHORT))
    window_end = time.monotonic() + 1.5
    await wait_for(
        lambda: time.monotonic() >= window_end and len(trained(c, SHORT)) >= short_at + 10,
        "1.5 s and 10 steps of the short job",
        timeout=30,
    )
    assert (await manager_gpu_states(c)).get(LONG) == "frozen"  # still, across the window
    assert len(trained(c, LONG)) == long_at
    assert len(trained(c, SHORT)) >= short_at + 10
    # Only the long job was ever frozen.
    plans = agent_events(c, "specon.agent.gpu_plan")
    assert plans and all(p["freeze"] in ([], [LONG]) for p in plans), plans

    release(gate(tmp_path))
    await both_finish(c, held=[SHORT])
    # Once frozen it trained no step until the short job had finished: thawed then, not
    # time-sliced. (How many it trained before the first freeze depends on the machine's load.)
    short_end = next(float(str(r["ts"])) for r in records(c, SHORT) if r.get("event") == "finished")
    before = [r for r in records(c, LONG) if "loss" in r and float(str(r["ts"])) <= short_end]
    assert len(before) == long_at, (long_at, len(before), plans)
    await nothing_left_frozen(c)


async def suspend_the_long_job(c: EmbeddedCluster, tmp_path: Path) -> dict[str, object]:
    """Both jobs on the tight GPU; the long one takes its GPU memory once it has trained a while
    (a job's CUDA context comes after its imports), and from then on the two do not fit: the
    agent's ``specon.agent.gpu_suspended`` record once it is suspended. The short job is held
    (it stays on the GPU however long that takes): the caller releases it."""
    await c.submit(job(SHORT, release=gate(tmp_path)), W0)
    await c.submit(job(LONG), W0)
    await wait_for(lambda: len(trained(c, LONG)) >= 20, "the long job to train 20 steps")
    write_gpu(gpu_file(tmp_path), memory_total=GIB, jobs={SHORT: TIGHT, LONG: TIGHT})
    await wait_for(lambda: bool(agent_events(c, "specon.agent.gpu_suspended")), "a suspend", timeout=30)
    (suspended,) = agent_events(c, "specon.agent.gpu_suspended")
    return suspended


async def test_a_job_whose_memory_leaves_no_room_is_suspended_and_restored_with_exactly_its_steps(
    tight: EmbeddedCluster, tmp_path: Path
) -> None:
    c = tight
    suspended = await suspend_the_long_job(c, tmp_path)
    assert suspended["container"] == LONG and suspended["memory"] == TIGHT
    assert not any(x.id == LONG and x.alive for x in await c.containers())  # it exited
    got = await metrics(c)
    assert got["specon_agent_gpu_suspends_total"] == 1
    assert got['specon_agent_gpu_jobs{state="suspended"}'] == 1
    assert json.loads((c.volume / "agents" / W0 / "monitor.gpu.json").read_text())["jobs"][LONG]["state"] == (
        "suspended"
    )
    assert not finished(c, SHORT)  # it was suspended beside a running job, not after it

    release(gate(tmp_path))  # the short job may now finish and leave the GPU
    await wait_for(lambda: bool(agent_events(c, "specon.agent.gpu_resumed")), "the resume", timeout=40)
    (resumed,) = agent_events(c, "specon.agent.gpu_resumed")
    assert resumed["container"] == LONG
    assert finished(c, SHORT)  # due (its memory fits) only once the short job left the GPU
    await both_finish(c, held=[SHORT])
    # It checkpointed where it stopped and resumed from there: nothing lost, nothing repeated.
    ev = events(c, LONG)
    (checkpointed,) = [s for e, s in ev if e == "checkpointed"]
    assert checkpointed == suspended["step"] and checkpointed >= 20
    assert [s for e, s in ev if e == "started"] == [0, checkpointed], ev
    assert (await metrics(c))["specon_agent_gpu_resumes_total"] == 1
    assert set((await manager_gpu_states(c)).values()) == {"running"}


async def test_the_manager_reports_a_suspended_job_as_suspended(
    tight: EmbeddedCluster, tmp_path: Path
) -> None:
    c = tight
    try:
        await suspend_the_long_job(c, tmp_path)
        # A bound on a hang, not a measurement: the report rides on the next heartbeats, which a
        # loaded machine delays (5 s ran out in a full serial run of the suite).
        await wait_for(
            lambda: state_is(c, LONG, "suspended"), "the manager to report it suspended", timeout=30
        )
    finally:
        release(gate(tmp_path))


async def test_a_job_frozen_when_its_agent_is_killed_is_thawed_by_the_next_agent(
    shared: EmbeddedCluster, tmp_path: Path
) -> None:
    c = shared
    await c.submit(job(SHORT, release=gate(tmp_path)), W0)  # held: it runs until the agent is killed
    await c.submit(job(LONG), W0)
    await wait_for(lambda: frozen_now_is(c, 1.0), "the long job to be frozen", timeout=30)
    state_file = c.volume / "agents" / W0 / "monitor.gpu.json"
    assert json.loads(state_file.read_text())["jobs"][LONG]["state"] == "frozen"

    c.kill(c.agents[W0], signal.SIGKILL)  # no close(): nothing thaws it
    long_at = len(trained(c, LONG))
    release(gate(tmp_path))
    # The short job ends while no agent runs; the long one stays frozen meanwhile.
    await wait_for(lambda: finished(c, SHORT), "the short job to finish without an agent", timeout=40)
    await asyncio.sleep(1.0)
    assert len(trained(c, LONG)) == long_at and not finished(c, LONG)

    # The next agent finds the long job alone on the GPU; only its state file says it is frozen.
    await c.start_agent(W0, AGENT_HOST)
    await wait_for(
        lambda: len(trained(c, LONG)) > long_at + 5, "the new agent to thaw the long job", timeout=20
    )
    await both_finish(c, held=[SHORT])
    assert (await metrics(c))["specon_agent_gpu_thaws_total"] >= 1
    await nothing_left_frozen(c)


async def test_a_short_job_arriving_beside_a_long_one_runs_first(shared: EmbeddedCluster) -> None:
    c = shared
    await c.submit(job(LONG), W0)
    await wait_for(lambda: len(trained(c, LONG)) >= 40, "the long job to train 40 steps")
    # 160 steps left against the long job's 280 or so: the agent sees the short job 120 of the
    # long one's steps (6 s) before their order could flip, however slow the machine is to start it.
    await c.submit(job(SHORT), W0)
    # Behaviour, not timing: it runs first, so it ends first (frozen until the long job ended,
    # it would end last).
    await wait_for(lambda: finished(c, SHORT) or finished(c, LONG), "a job to finish", timeout=60)
    assert finished(c, SHORT) and not finished(c, LONG), agent_events(c, "specon.agent.gpu_plan")
    await both_finish(c)


async def state_is(c: EmbeddedCluster, jid: str, state: str) -> bool:
    return (await manager_gpu_states(c)).get(jid) == state
