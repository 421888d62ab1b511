"""Partitions between hosts: the manager and two agents on network hosts of their own
(``net_hosts``), a host's link cut (``ip link set eth0 down`` in its namespace) while a job is
being saved, while it is being restored, and while nothing moves; mended after a while,
shorter than the manager's ``worker_timeout`` in some cases and longer in others.

Whatever was cut, the migration ends ``done`` or ``rolled_back``, the job never runs twice at
once (the ``/proc`` watchdog), redoes no step before its last complete checkpoint, finishes
with exactly its steps, and every agent comes back by itself: the same process, its
heartbeats accepted by the manager again, nobody restarting anything.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest
from jobwatch import (
    LOST_AFTER as MOVE_LOST_AFTER,
)
from jobwatch import (
    Watchdog,
    agent_health,
    assert_finished_once,
    finished,
    has_event,
    in_state,
    job_processes,
    migration_of,
    runs,
    spec,
    status,
    wait_for,
    worker_reachable,
)

from specon.embedded.cluster import Daemon, EmbeddedCluster
from specon.model import WorkerId
from specon.testing.held_jobs import finished_steps, release
from specon.testing.net_hosts import NetHost, NetHosts
from specon.wire.status import MigrationStatus
from tests.hosts import tls_if_available

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.timeout(240)]

Hosts = Callable[[int], NetHosts]
W0, W1 = WorkerId("w0"), WorkerId("w1")
HEARTBEAT = 0.5
WORKER_TIMEOUT = 4.0
SHORT = 1.5  # a blip, well under worker_timeout
LONGER = 2.0  # how long a long partition lasts beyond the moment the host was given up
# A job may run nowhere while a partition keeps its save result or its start from the
# manager: the partition, a request that was in flight when it began (request_timeout), the
# restore, on top of any move's time. Longer than this, it has been lost.
LOST_AFTER = MOVE_LOST_AFTER + 30.0
STEPS = 500  # of the converging job; held (``until_released``) until its migration has ended
SAVE_SECONDS = 3.0  # the save on SIGTERM, and loading the checkpoint, take this long:
RESTORE_SECONDS = 3.0  # long enough to cut the link in the middle of either


def policy(path: Path) -> Path:
    path.write_text(
        "apiVersion: specon/v1alpha1\n"
        "kind: Policy\n"
        "monitor: {interval: 1, alpha: 0.02}\n"
        f"messaging: {{heartbeat_interval: {HEARTBEAT}, worker_timeout: {WORKER_TIMEOUT}}}\n"
        "migration: {grace_period: 10, save_timeout: 30, restore_timeout: 30, min_residence: 0}\n"
        "placement: {require_gain: false}\n"  # the mechanics are tested: Algorithm 2's move is made
        'rebalance: {mode: "off"}\n'
    )
    return path


@dataclass
class OnHosts:
    c: EmbeddedCluster
    hosts: NetHosts

    def host_of(self, who: str) -> NetHost:
        """The manager's host, or the host of the move's source (w0) or target (w1)."""
        return self.hosts[{"manager": 0, "source": 1, "target": 2}[who]]


@contextlib.asynccontextmanager
async def on_hosts(net_hosts: Hosts, tmp_path: Path) -> AsyncIterator[OnHosts]:
    """Manager on host 0, w0's agent on host 1, w1's on host 2; over TLS where the test CA
    exists. Every link is mended before the cluster stops, whatever happened."""
    hosts = net_hosts(3)
    tls = tls_if_available(tmp_path, hosts[0])
    async with EmbeddedCluster(
        tmp_path / "c",
        workers=2,
        cpus_per_worker=0.5,
        policy=policy(tmp_path / "policy.yaml"),
        hosts=list(hosts),
        tls=tls,
    ) as c:
        try:
            yield OnHosts(c, hosts)
        finally:
            for host in hosts:
                if host.is_cut():
                    host.mend()
            if c.manager is not None:  # a SIGTERMed manager waits out open long polls
                c.kill(c.manager)


# -- what the manager says ----------------------------------------------------------------------
async def heartbeats_from(c: EmbeddedCluster, worker: WorkerId) -> float | None:
    """The manager's count of accepted heartbeats from ``worker``; None while it cannot be asked."""
    assert c.manager is not None
    try:
        async with (
            aiohttp.ClientSession() as s,
            s.get(c.manager.url + "/metrics", timeout=aiohttp.ClientTimeout(total=2), ssl=c.ssl) as r,
        ):
            text = await r.text()
    except (aiohttp.ClientError, OSError, TimeoutError):
        return None
    key = f'specon_manager_heartbeats_total{{worker="{worker}"}}'
    return next((float(v) for k, _, v in (ln.partition(" ") for ln in text.splitlines()) if k == key), 0.0)


async def migration_by_id(c: EmbeddedCluster, mid: str) -> MigrationStatus | None:
    st = await status(c)
    return next((m for m in (st.migrations if st else ()) if m.id == mid), None)


async def assert_back_by_itself(c: EmbeddedCluster, agents: dict[WorkerId, Daemon]) -> None:
    """Each agent is the process it was, connected again, its new heartbeats accepted."""
    for w, d in agents.items():
        assert c.agents[w] is d and d.proc.poll() is None, f"{d.name} was restarted or died"
        counts: list[float] = []

        async def beats_again(w: WorkerId = w, counts: list[float] = counts) -> bool:
            now = await heartbeats_from(c, w)
            if now is not None:
                counts.append(now)
            return len(counts) > 1 and counts[-1] >= counts[0] + 3 and await worker_reachable(c, w) is True

        await wait_for(beats_again, f"{w}'s heartbeats to be accepted again", timeout=60)

        async def connected(d: Daemon = d) -> bool:
            # (A long poll sent before the cut may still time out once, a moment after.)
            h = await agent_health(d)
            return h is not None and h["manager_connected"] is True

        await wait_for(connected, f"{d.name} to say it is connected", timeout=30)


# -- a migration in flight ----------------------------------------------------------------------
async def agents_lost_the_manager(agents: dict[WorkerId, Daemon]) -> bool:
    """Every agent says its manager link is down (its requests failed or timed out)."""
    hs = [await agent_health(d) for d in agents.values()]
    return all(x is not None and x["manager_connected"] is False for x in hs)


async def cut_off_for_long(
    c: EmbeddedCluster, who: str, agents: dict[WorkerId, Daemon], dog: Watchdog
) -> None:
    """Wait, the host cut, until the other side has given up on it: the manager has marked the
    agent unreachable (``worker_timeout``), or the agents have lost the manager."""
    if who == "manager":
        lost = "the agents to lose the manager"
        await wait_for(lambda: agents_lost_the_manager(agents), lost, timeout=60, watchdog=dog)
        return
    worker = W0 if who == "source" else W1

    async def given_up() -> bool:
        return await worker_reachable(c, worker) is False

    await wait_for(given_up, f"the manager to give {worker} up", timeout=30, watchdog=dog)


async def cut_mid_migration(net_hosts: Hosts, tmp_path: Path, who: str, during: str, mend: str) -> None:
    """Cut ``who``'s host (the manager's, the source's or the target's) ``during``:

    * ``saving``: the job is writing its checkpoint on SIGTERM (the save takes 3 s);
    * ``restore-ordered``: the manager has ordered the start on the target, whose link was cut
      a moment before (the save is held by a gate until the cut);
    * ``restoring``: the job's process runs on the target, loading its checkpoint (3 s).

    Mend it after ``SHORT`` s (``early``), or (``late``) once the other side has given the host
    up, ``LONGER`` s after that.

    ``conv`` trains on past its steps until the migration has ended (``until_released``): a
    loaded machine cannot end it before it is saved, restored, or cut off."""
    gate = tmp_path / "save-gate"
    end = tmp_path / "release-conv"
    async with (
        on_hosts(net_hosts, tmp_path) as h,
        Watchdog(h.c, "conv", lost_after=LOST_AFTER) as dog,
        Watchdog(h.c, "steady"),
    ):
        c = h.c
        agents = dict(c.agents)
        host = h.host_of(who)
        # On w0: conv converges in seconds and asks to move to the empty w1; steady keeps
        # progressing, so w0 stays the busier worker.
        await c.submit(spec("steady", 4000, "linear"), W0)
        held = during == "restore-ordered"
        job = spec(
            "conv",
            STEPS,
            "converge",
            save_seconds=8.0 if held else SAVE_SECONDS,  # the gate ends a held save much sooner
            save_gate=gate if held else None,
            restore_seconds=RESTORE_SECONDS,
            until_released=end,
        )
        await c.submit(job, W0)
        if during == "restoring":
            await wait_for(lambda: "w1" in job_processes(c, "conv").values(), "conv's restore", timeout=90)
        else:
            await wait_for(lambda: has_event(c, "conv", "saving"), "conv to start saving", timeout=90)
        if held:
            host.cut()
            gate.touch()
            await wait_for(in_state(c, "conv", "restoring"), "the start to be ordered", timeout=20)
            m = await migration_of(c, "conv")
        else:
            m = await migration_of(c, "conv")
            host.cut()
        assert m is not None, "no migration of conv"
        if mend == "late":
            await cut_off_for_long(c, who, agents, dog)
        # The partition itself: its length is the fault, not a wait for something.
        await asyncio.sleep(SHORT if mend == "early" else LONGER)
        host.mend()
        await assert_back_by_itself(c, agents)

        async def ended() -> bool:
            got = await migration_by_id(c, m.id)
            return got is not None and got.state.value in ("done", "rolled_back")

        await wait_for(ended, f"migration {m.id} to end", timeout=60, watchdog=dog)
        release(end)
        await wait_for(lambda: finished(c, "conv"), "conv to finish", timeout=90, watchdog=dog)
        steps = finished_steps(c.volume, "conv")
        assert steps >= STEPS, f"conv finished after {steps} steps, fewer than its {STEPS}"
        rs = await assert_finished_once(c, dog, steps)
        final = await migration_by_id(c, m.id)
        assert final is not None
        # The save on SIGTERM completed whatever was cut: the next run resumed from its
        # checkpoint, redoing nothing.
        assert rs[0].ending == "checkpointed" and rs[1].resumed_from == rs[0].trained[-1], rs[:2]
        # It ended on the target if the migration is done; a rollback restarts the job on its
        # source, or on the target when the source is the one cut off.
        allowed = {final.target} if final.state.value == "done" else {final.source, final.target}
        assert dog.workers[-1] in allowed, (dog.workers, final)
        assert len(runs(c, "steady")) == 1, "steady was stopped although nobody moved it"


@pytest.mark.parametrize("mend", ["early", "late"])
async def test_source_cut_during_a_save(net_hosts: Hosts, tmp_path: Path, mend: str) -> None:
    await cut_mid_migration(net_hosts, tmp_path, "source", "saving", mend)


@pytest.mark.parametrize(("during", "mend"), [("restore-ordered", "early"), ("restore-ordered", "late"),
                                              ("restoring", "late")])  # fmt: skip
async def test_target_cut_during_a_restore(net_hosts: Hosts, tmp_path: Path, during: str, mend: str) -> None:
    await cut_mid_migration(net_hosts, tmp_path, "target", during, mend)


@pytest.mark.parametrize(("during", "mend"), [("saving", "late"), ("restoring", "early")])
async def test_manager_cut_during_a_migration(
    net_hosts: Hosts, tmp_path: Path, during: str, mend: str
) -> None:
    await cut_mid_migration(net_hosts, tmp_path, "manager", during, mend)


# -- nothing moving ---------------------------------------------------------------------------
@pytest.mark.parametrize("who", ["agent", "manager"])
async def test_cut_while_idle_the_job_keeps_running_where_it_is(
    net_hosts: Hosts, tmp_path: Path, who: str
) -> None:
    """A job that progresses steadily on w1 (nothing to move): w1's host, or the manager's,
    cut for longer than ``worker_timeout``. The job trains on through the partition, on w1
    only, and finishes in one run; the agents come back by themselves. It trains on past its
    steps until the partition is mended and the agents are back (``until_released``)."""
    steps = 400
    end = tmp_path / "release-solo"
    async with on_hosts(net_hosts, tmp_path) as h, Watchdog(h.c, "solo") as dog:
        c = h.c
        agents = dict(c.agents)
        await c.submit(spec("solo", steps, "linear", until_released=end), W1)

        def trained_by(jid: str) -> int:
            rs = runs(c, jid)
            return len(rs[-1].trained) if rs else 0

        async def seen_on_w1() -> bool:
            st = await status(c)
            return st is not None and any(ci.id == "solo" and ci.worker == W1 for ci in st.containers)

        await wait_for(seen_on_w1, "the manager to see solo on w1", timeout=30)
        await wait_for(lambda: trained_by("solo") > 0, "solo to train", timeout=30)
        host = h.host_of("target" if who == "agent" else "manager")
        host.cut()
        trained = trained_by("solo")
        await cut_off_for_long(c, "target" if who == "agent" else "manager", agents, dog)
        # Cut off, it keeps training.
        await wait_for(lambda: trained_by("solo") >= trained + 20, "solo to keep training", timeout=30)
        host.mend()
        await assert_back_by_itself(c, agents)
        release(end)
        await wait_for(lambda: finished(c, "solo"), "solo to finish", timeout=90, watchdog=dog)
        total = finished_steps(c.volume, "solo")
        assert total >= steps, f"solo finished after {total} steps, fewer than its {steps}"
        rs = await assert_finished_once(c, dog, total)
        assert len(rs) == 1 and dog.workers == ["w1"], "the job was stopped or moved"
        st = await status(c)
        assert st is not None and not st.migrations
