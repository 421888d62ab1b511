"""Recovery and drain across network hosts (issue 33): the manager and two agents each on a
network host of its own (``net_hosts``: a network namespace, 198.51.100.0/24 on a test bridge),
over TLS where the test CA exists, the local runtime on each host, one shared volume.

Each job's process runs in the namespace of the host that runs it: the driver starts the first
run inside the first agent's host (``start_in``), and an agent starts restores in its own. So:

* **a dead host**: everything in w0's namespace is SIGKILLed at once (its agent, and every
  launcher and job process on it), as a machine that dies takes them. Each job resumes on w1
  from its newest complete checkpoint and finishes with exactly its steps, never two copies at
  once, losing no step before its last checkpoint;
* **a host cut off**: w0's link is taken down for longer than ``recovery.after`` while its job
  trains. The job is restored on w1; the copy still running on the cut-off host commits
  nothing once the new generation has begun (``assert_stale_copy_committed_nothing``: no event
  record of an older generation after the newer one's ``started``, no record and no checkpoint
  made after the bump of ``generation.json`` but the new copy's); once the link is mended the
  stale copy is gone within seconds (fenced, exit 76, or killed), and the job finishes once,
  with exactly its steps. The hosts share one kernel, as every network host of this machine
  does: w0's run is one w1 can see alive (same boot, same ``/proc``);
* **a drain**: ``specon drain w0 --wait`` moves its three jobs to w1, each with a fresh
  checkpoint (its save on SIGTERM), losing no step.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import json
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from jobwatch import (
    CHECKPOINT_EVERY,
    Watchdog,
    assert_exactly_its_steps,
    assert_finished_once,
    drained_with_fresh_checkpoints,
    finished,
    in_state,
    job_processes,
    migration_of,
    records,
    runs,
    spec,
    training,
    wait_for,
)

from specon.embedded.cluster import EmbeddedCluster
from specon.model import ContainerId, WorkerId
from specon.runtime.base import JobSpec
from specon.runtime.local.launcher import ExitRecord
from specon.runtime.volume import JobPaths
from specon.testing.held_jobs import finished_steps, release
from specon.testing.host_kill import kill_host
from specon.testing.net_hosts import NetHost, NetHosts
from tests.hosts import tls_if_available

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.timeout(150)]

Hosts = Callable[[int], NetHosts]
W0, W1 = WorkerId("w0"), WorkerId("w1")
HEARTBEAT = 0.5
# 2 s: on 2 CPUs at a load of 20-30 heartbeats came late past it and a drain's save was given up.
WORKER_TIMEOUT = 4.0
AFTER = 6.0  # recovery.after: a worker silent this long is lost, its jobs restored elsewhere
STEPS = 200  # each job trains at least this many (held: ``until_released``)
# A job runs nowhere while its host is taken for lost (``AFTER``) and while it is restored:
# past this it has been lost. A bound on a hang, not a measurement.
LOST_AFTER = AFTER + 40.0
# How soon a stale copy must be gone once its host's link is mended.
GONE_WITHIN = 10.0
CLONE_NEWNET = 0x40000000
# How far a file's mtime (the kernel's coarse clock) may lag ``time.time()``.
SLACK = 0.02


def policy(path: Path, *, worker_timeout: float = WORKER_TIMEOUT, after: float = AFTER) -> Path:
    path.write_text(
        "apiVersion: specon/v1alpha1\n"
        "kind: Policy\n"
        f"messaging: {{heartbeat_interval: {HEARTBEAT}, worker_timeout: {worker_timeout}}}\n"
        f"recovery: {{after: {after}, backoff: 1, max_backoff: 2}}\n"
        'rebalance: {mode: "off"}\nplacement: {require_gain: true}\n'
    )
    return path


@dataclass
class OnHosts:
    c: EmbeddedCluster
    hosts: NetHosts

    def host_of(self, worker: WorkerId) -> NetHost:
        return self.hosts[1 + self.c.workers.index(worker)]


@contextlib.asynccontextmanager
async def on_hosts(net_hosts: Hosts, tmp_path: Path, *, cpus: float) -> AsyncIterator[OnHosts]:
    """The manager on host 0, w0's agent on host 1, w1's on host 2. Every link is mended and
    the manager SIGKILLed (it would wait out the agents' long polls) before the cluster stops."""
    hosts = net_hosts(3)
    async with EmbeddedCluster(
        tmp_path / "c",
        workers=2,
        cpus_per_worker=cpus,
        policy=policy(tmp_path / "policy.yaml"),
        hosts=list(hosts),
        tls=tls_if_available(tmp_path, hosts[0]),
    ) as c:
        try:
            yield OnHosts(c, hosts)
        finally:
            mend_and_stop_manager(c, hosts)


# -- a job's processes in a host's namespace -------------------------------------------------------
def _setns(fd: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setns: {os.strerror(err)}")


async def start_in(h: OnHosts, job: JobSpec, worker: WorkerId) -> None:
    """Start ``job`` on ``worker`` as the driver does (``c.submit``), its launcher and job
    process in ``worker``'s host's network namespace, as that host's own processes. (A network
    namespace is a thread's: the runtime's launcher is forked from a thread that entered it,
    and that thread goes back to ours before it is reused.)"""
    host = h.host_of(worker)

    def in_host() -> None:
        ours = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
        theirs = os.open(f"/run/netns/{host.ns}", os.O_RDONLY)
        try:
            _setns(theirs)
            try:
                asyncio.run(h.c.submit(job, worker))
            finally:
                _setns(ours)
        finally:
            os.close(ours)
            os.close(theirs)

    await asyncio.to_thread(in_host)
    await wait_for(lambda: bool(job_processes(h.c, job.id)), f"{job.id}'s process", timeout=30)
    procs = job_processes(h.c, job.id)
    assert all(host.holds(pid) for pid in procs), f"{job.id} does not run in {worker}'s host"


def runs_in_host(h: OnHosts, jid: str, worker: WorkerId) -> bool:
    """Whether a process of ``jid`` runs for ``worker``, in ``worker``'s host."""
    mine = [pid for pid, w in job_processes(h.c, jid).items() if w == worker]
    return bool(mine) and all(h.host_of(worker).holds(pid) for pid in mine)


def checkpointed(c: EmbeddedCluster, jid: str) -> bool:
    return any(r.get("event") == "checkpoint" for r in records(c, jid))


def trained(c: EmbeddedCluster, jid: str) -> int:
    total = finished_steps(c.volume, jid)
    assert total >= STEPS, f"{jid}: finished after {total} steps, fewer than its {STEPS}"
    return total


def mend_and_stop_manager(c: EmbeddedCluster, hosts: Sequence[NetHost]) -> None:
    """A test's end, before the cluster stops: every link mended, the manager SIGKILLed."""
    for host in hosts:
        if host.is_cut():
            host.mend()
    if c.manager is not None:
        c.kill(c.manager)


def kill_the_host(h: Any, worker: WorkerId, jobs: tuple[str, ...]) -> None:
    """The host of ``worker`` dies: its agent and every process of its jobs at once, no save,
    no goodbye (``h``: hosts with ``c`` and ``host_of``, local or Docker)."""
    c = h.c
    before = {j: set(job_processes(c, j)) for j in jobs}
    killed = kill_host(c, worker, h.host_of(worker))
    assert c.agents[worker].proc.pid in killed
    for j in jobs:
        assert before[j] and before[j] <= killed, (j, before[j], killed)
        assert not job_processes(c, j), f"{j} still runs"


async def recovered(c: EmbeddedCluster, job: str, dog: Watchdog) -> None:
    """``job`` restored on w1 by a ``recovered`` migration from w0, done."""
    await wait_for(in_state(c, job, "done"), f"{job}'s recovery", timeout=60, watchdog=dog)
    m = await migration_of(c, job)
    assert m is not None and (m.reason, m.source, m.target) == ("recovered", W0, W1), m


# -- 1a: a host dies -----------------------------------------------------------------------------------
async def test_a_dead_hosts_jobs_resume_on_another_host_with_exactly_their_steps(
    net_hosts: Hosts, tmp_path: Path
) -> None:
    jobs = ("dead1", "dead2")
    gates = {j: tmp_path / f"release-{j}" for j in jobs}
    async with on_hosts(net_hosts, tmp_path, cpus=1.0) as h, contextlib.AsyncExitStack() as stack:
        c = h.c
        dogs = {j: await stack.enter_async_context(Watchdog(c, j, lost_after=LOST_AFTER)) for j in jobs}
        for j in jobs:
            await start_in(h, spec(j, STEPS, "linear", until_released=gates[j]), W0)
        for j in jobs:
            await wait_for(
                lambda j=j: checkpointed(c, j), f"{j}'s first checkpoint", timeout=40, watchdog=dogs[j]
            )
        kill_the_host(h, W0, jobs)
        for j in jobs:
            await recovered(c, j, dogs[j])
            # Restored by w1's agent: in w1's host.
            await wait_for(lambda j=j: runs_in_host(h, j, W1), f"{j} in w1's host", timeout=10)
        for j in jobs:
            release(gates[j])
        for j in jobs:
            await wait_for(lambda j=j: finished(c, j), f"{j} to finish", timeout=60, watchdog=dogs[j])
            rs = await assert_finished_once(c, dogs[j], trained(c, j))
            # It resumed on w1 from the newest checkpoint the dead run completed: it redid at
            # most the steps after that checkpoint.
            assert dogs[j].workers == [W0, W1] and len(rs) == 2, (j, dogs[j].workers, rs)
            assert rs[0].ending is None, f"{j}'s first run was not killed: {rs[0]}"
            assert rs[1].resumed_from == rs[0].checkpoints[-1], (j, rs)
            assert rs[0].trained[-1] - rs[1].resumed_from < CHECKPOINT_EVERY, (j, rs)


# -- 1b: a host cut off ----------------------------------------------------------------------------------
@dataclass
class Manifests:
    """Every checkpoint manifest of a job seen while it ran, sampled every 50 ms (older ones are
    pruned as new ones are written): (step, created) pairs."""

    c: EmbeddedCluster
    jid: str
    seen: set[tuple[int, float]] = field(default_factory=set)

    def sample(self) -> None:
        for path in JobPaths(self.c.volume, ContainerId(self.jid)).checkpoints.glob("ckpt-*.json"):
            with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
                meta = json.loads(path.read_bytes())
                self.seen.add((int(meta["step"]), float(meta["created"])))

    async def run(self) -> None:
        while True:
            self.sample()
            await asyncio.sleep(0.05)


def generation_of_run(rec: dict[str, Any]) -> int | None:
    g = rec.get("generation")
    return g if isinstance(g, int) else None


def assert_stale_copy_committed_nothing(c: EmbeddedCluster, jid: str, manifests: Manifests) -> int:
    """Nothing a stale copy wrote after the newest generation began: no event record of an
    older generation after the newest's ``started`` or stamped after the bump of
    ``generation.json``; no training sample stamped after the bump but the newest run's own;
    no checkpoint made after the bump before the newest run had trained to its step. The
    newest generation.

    A record is stamped before the fence check that lets it be written, so one stamped after
    the bump was checked after it (the bump's time is the file's mtime, a coarse clock:
    ``SLACK`` allows for it)."""
    paths = JobPaths(c.volume, ContainerId(jid))
    newest, bumped = paths.read_generation(), paths.generation.stat().st_mtime + SLACK
    recs = records(c, jid)
    started = [(i, generation_of_run(r)) for i, r in enumerate(recs) if r.get("event") == "started"]
    assert all(g is not None for _, g in started), f"{jid}: a started record without a generation: {recs}"
    assert newest in {g for _, g in started}, f"{jid}: generation {newest} never started: {started}"
    seen = 0
    for i, r in enumerate(recs):
        g = generation_of_run(r)
        if g is not None and r.get("event") == "started":
            seen = max(seen, g)
        if g is not None:
            assert g >= seen, f"{jid}: record {i} of generation {g} after generation {seen} started: {r}"
            assert g == newest or float(r["ts"]) < bumped, (
                f"{jid}: record {i} of generation {g} made after generation {newest} began: {r}"
            )
    # The newest run's samples (they name no generation): the chain of steps from where it
    # resumed. A stale copy's, were any written, would be ahead of it, off the chain.
    last_start = max(i for i, g in started if g == newest)
    trained_at: dict[int, float] = {}
    step = int(recs[last_start]["step"])
    for i, r in enumerate(recs):
        if "loss" not in r:
            continue
        if i > last_start and int(r["step"]) == step + 1:
            step += 1
            trained_at[step] = float(r["ts"])
        else:
            assert float(r["ts"]) < bumped, (
                f"{jid}: sample {i} made after generation {newest} began, not by its run: {r}"
            )
    manifests.sample()
    for step, created in sorted(manifests.seen):
        if created >= bumped:
            assert step in trained_at and trained_at[step] <= created, (
                f"{jid}: checkpoint of step {step} made at {created:.3f}, after generation {newest} "
                f"began ({bumped:.3f}), before its run trained to it ({trained_at.get(step)}): "
                "the stale copy wrote it"
            )
    return newest


def refusals(c: EmbeddedCluster, worker: WorkerId) -> list[str]:
    """The errors of the commands ``worker``'s agent failed, from its log."""
    out = []
    for line in c.agents[worker].log_path.read_text(errors="replace").splitlines():
        with contextlib.suppress(ValueError):
            event = json.loads(line)
            if event.get("event") == "specon.agent.command_finished" and event.get("ok") is False:
                out.append(f"{event.get('command')}: {event.get('error')}")
    return out


def exit_records(c: EmbeddedCluster, jid: str) -> list[ExitRecord]:
    return JobPaths(c.volume, ContainerId(jid)).read_exits()[0]


async def test_a_host_cut_off_past_recovery_after_has_its_job_restored_and_its_stale_copy_commits_nothing(
    net_hosts: Hosts, tmp_path: Path
) -> None:
    async with on_hosts(net_hosts, tmp_path, cpus=0.5) as h:
        await cut_off_past_recovery_after(h, lambda job: start_in(h, job, W0), tmp_path / "release-cut")


async def cut_off_past_recovery_after(
    h: OnHosts,
    start: Callable[[JobSpec], Awaitable[None]],
    gate: Path,
    *,
    after: float = AFTER,
    jid: str = "cut",
) -> None:
    """The job ``jid`` started on w0 (``start``), w0's link cut until the job has been
    restored on w1 and both sides have run on a while; then mended. ``after``: the policy's
    ``recovery.after``. Shared with the Docker hosts' test (test_recovery_docker_hosts.py)."""
    c = h.c
    host = h.host_of(W0)
    manifests = Manifests(c, jid)
    sampler = asyncio.create_task(manifests.run())
    try:
        await start(spec(jid, STEPS, "linear", until_released=gate))
        await wait_for(lambda: checkpointed(c, jid), "a first checkpoint", timeout=60)
        stale = job_processes(c, jid)
        assert list(stale.values()) == [W0], stale
        host.cut()
        cut_at = time.monotonic()
        # Taken for lost after recovery.after, the job is restored on w1 while w0's copy, cut
        # off from everyone but the shared volume, may still be training.
        try:
            await wait_for(in_state(c, jid, "done"), "the recovery to finish", timeout=30)
        except AssertionError as err:
            raise AssertionError(f"{err}; w1's refusals: {refusals(c, W1)[-2:]}") from err
        m = await migration_of(c, jid)
        assert m is not None and (m.reason, m.source, m.target) == ("recovered", W0, W1), m
        assert time.monotonic() - cut_at >= after - 1.0, "restored before w0 was lost"
        await wait_for(lambda: W1 in job_processes(c, jid).values(), "the restored copy", timeout=10)
        # Let both sides run a while, w0 still cut off: the stale copy, if alive, would write
        # its next progress record and checkpoint (one every 50 steps, 2.5 s).
        await asyncio.sleep(CHECKPOINT_EVERY * 0.05 + 1.0)
        assert host.is_cut()
        assert_stale_copy_committed_nothing(c, jid, manifests)
        host.mend()

        def stale_gone() -> bool:
            return not any(pid in stale for pid in job_processes(c, jid))

        await wait_for(stale_gone, "the stale copy to be gone after the link was mended", timeout=GONE_WITHIN)
        release(gate)
        await wait_for(lambda: finished(c, jid), "the job to finish", timeout=60)
    finally:
        sampler.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await sampler
    newest = assert_stale_copy_committed_nothing(c, jid, manifests)
    assert newest >= 2, f"no newer generation started: {newest}"
    rs = assert_exactly_its_steps(c, jid, trained(c, jid))
    # The stale run ended fenced (exit 76) or killed: it never recorded an ending of its own.
    assert rs[0].ending is None, rs[0]

    async def on_record() -> list[tuple[str, bool, bool, int | None]]:
        return [
            (ci.worker, ci.alive, ci.finished, ci.exit_code) for ci in await c.containers() if ci.id == jid
        ]

    async def exited() -> bool:  # it logs "finished" a moment before its process ends
        return not any(alive for _, alive, _, _ in await on_record())

    await wait_for(exited, f"{jid} to exit", timeout=30)
    assert not job_processes(c, jid)
    mine = await on_record()
    assert [r[:3] for r in mine if r[0] == W1] == [(W1, False, True)], mine
    if c.runtime_name == "local":  # one owner record, and the launcher's record of each run's end
        assert len(mine) == 1, mine
        ends = [e.exit_code for e in exit_records(c, jid) if e.worker == W0]
        assert ends, f"no record of how the stale copy ended: {exit_records(c, jid)}"
    else:  # each engine lists its own containers: the stale one's, if not removed, has ended
        ends = [code for w, _, _, code in mine if w == W0]
    assert all(code in (76, 137, None) for code in ends), f"the stale copy ended {ends}"


# -- 1c: a drain -------------------------------------------------------------------------------------------


async def test_drain_moves_three_jobs_off_a_host_each_with_a_fresh_checkpoint(
    net_hosts: Hosts, tmp_path: Path
) -> None:
    jobs = ("d1", "d2", "d3")
    gates = {j: tmp_path / f"release-{j}" for j in jobs}
    async with on_hosts(net_hosts, tmp_path, cpus=1.5) as h, contextlib.AsyncExitStack() as stack:
        c = h.c
        dogs = {j: await stack.enter_async_context(Watchdog(c, j)) for j in jobs}
        for j in jobs:
            await start_in(h, spec(j, STEPS, "linear", until_released=gates[j]), W0)
        await wait_for(lambda: training(c, *jobs), "the jobs training", timeout=60)
        await drained_with_fresh_checkpoints(c, jobs, W0, W1)
        for j in jobs:
            await wait_for(lambda j=j: runs_in_host(h, j, W1), f"{j} in w1's host", timeout=10)
        for j in jobs:
            release(gates[j])
        for j in jobs:
            await wait_for(lambda j=j: finished(c, j), f"{j} to finish", timeout=60, watchdog=dogs[j])
            rs = await assert_finished_once(c, dogs[j], trained(c, j))
            # Saved on SIGTERM (a fresh checkpoint at the step it had reached), resumed there.
            assert dogs[j].workers == [W0, W1] and len(rs) == 2, (j, dogs[j].workers, rs)
            assert rs[0].ending == "checkpointed" and rs[1].resumed_from == rs[0].trained[-1], (j, rs)
        assert len(runs(c, "d1")) == 2
