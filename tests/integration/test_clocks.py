"""Hosts whose clocks disagree: agents whose wall clocks are minutes off the manager's (under
libfaketime: ``clockskew``), on network hosts of their own, over TLS.

The manager keeps every duration on its own clock and translates an agent's times with the
same message's ``sent_at`` (``specon.wire.protocol``), so a skewed agent is served as any
other: its heartbeats are accepted, its classifications used, a converged job moves off it
and finishes with exactly its steps, and the migration's downtime is what it was, not the
skew. TLS is the one place a skew shows: a certificate must already be valid on the agent's
clock.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import aiohttp
import pytest
from clockskew import FaketimeUnavailableError, SkewedHost, prepare, tls_issued_earlier
from jobwatch import (
    Watchdog,
    agent_health,
    assert_finished_once,
    finished,
    records,
    spec,
    status,
    wait_for,
)

from specon.embedded.cluster import EmbeddedCluster
from specon.model import WorkerId
from specon.testing.held_jobs import finished_steps, release
from specon.testing.net_hosts import NetHosts
from tests.hosts import tls_for
from tests.integration.test_e2e_local import POLICY

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.timeout(240)]

Hosts = Callable[[int], NetHosts]
W0, W1 = WorkerId("w0"), WorkerId("w1")
AHEAD, BEHIND = 300.0, -420.0  # w0's clock is 5 minutes fast, w1's 7 minutes slow
STEPS = 500


@pytest.fixture(scope="module")
def preload() -> list[str]:
    """libfaketime (apt ``faketime``) and its sleep shim; skips only where they cannot be had."""
    try:
        return prepare()
    except FaketimeUnavailableError as exc:
        pytest.skip(f"skewed clocks need libfaketime: {exc}")


async def manager_metrics(c: EmbeddedCluster) -> dict[str, float]:
    assert c.manager is not None
    async with (
        aiohttp.ClientSession() as s,
        s.get(c.manager.url + "/metrics", timeout=aiohttp.ClientTimeout(total=5), ssl=c.ssl) as r,
    ):
        text = await r.text()
    out = {}
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key and not key.startswith("#"):
            out[key] = float(value)
    return out


async def test_agents_minutes_off_the_managers_clock_are_served_normally(
    net_hosts: Hosts, tmp_path: Path, preload: list[str]
) -> None:
    hosts = net_hosts(3)
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    # Issued an hour ago, as a CA does: valid on w1's slow clock too.
    tls = tls_issued_earlier(tmp_path / "tls", hosts[0].address, 3600, preload)
    skewed = [SkewedHost(hosts[1], AHEAD, tuple(preload)), SkewedHost(hosts[2], BEHIND, tuple(preload))]
    async with EmbeddedCluster(
        tmp_path / "c", workers=2, cpus_per_worker=0.5, policy=policy, hosts=[hosts[0], *skewed], tls=tls
    ) as c:
        try:
            # The agents' clocks really are off (their /healthz says their time).
            for w, skew in ((W0, AHEAD), (W1, BEHIND)):
                h = await agent_health(c.agents[w])
                assert h is not None and abs(h["time"] - time.time() - skew) < 5, (w, h)
            t0 = time.time()  # the manager's clock: this machine's
            end = tmp_path / "release-conv"  # conv trains on until it has been moved
            async with Watchdog(c, "conv") as dog:
                # conv converges on w0 and asks to move to the idle w1; steady keeps w0 busier.
                await c.submit(spec("steady", 4000, "linear"), W0)
                await c.submit(spec("conv", STEPS, "converge", until_released=end), W0)

                async def moved() -> bool:
                    st = await status(c)
                    return st is not None and any(
                        m.container == "conv" and m.state.value == "done" for m in st.migrations
                    )

                await wait_for(moved, "conv's migration to w1 to finish", timeout=90, watchdog=dog)
                release(end)
                await wait_for(lambda: finished(c, "conv"), "conv to finish", timeout=90, watchdog=dog)
                steps = finished_steps(c.volume, "conv")
                assert steps >= STEPS, f"conv finished after {steps} steps, fewer than its {STEPS}"
                rs = await assert_finished_once(c, dog, steps)
            st = await status(c)
            assert st is not None
            now = time.time()
            # Heartbeats accepted from both, their ages on the manager's clock.
            for ws in st.workers:
                assert ws.reachable and ws.heartbeat_age is not None and 0 <= ws.heartbeat_age < 3, ws
            metrics = await manager_metrics(c)
            for w in (W0, W1):
                assert metrics.get(f'specon_manager_heartbeats_total{{worker="{w}"}}', 0) > 10, w
            rejected = {
                k: v for k, v in metrics.items() if k.startswith("specon_manager_rejected_messages_total")
            }
            assert not any(rejected.values()), rejected
            # w0's classification was used: conv was judged converged and moved for it; its
            # converged time is on the manager's clock, not minutes off.
            m = next(m for m in st.migrations if m.container == "conv")
            assert (m.source, m.target, m.reason) == ("w0", "w1", "converged")
            conv = next(ci for ci in st.containers if ci.id == "conv")
            assert conv.t_cc is not None and t0 <= conv.t_cc <= now, (t0, conv.t_cc, now)
            # The downtime joins w0's stop (fast clock) to w1's restart (slow clock): translated,
            # it is the seconds it took, not 12 minutes either way.
            assert m.stopped_at is not None and m.started_at is not None and m.downtime is not None
            assert m.decided_at <= m.stopped_at <= m.started_at <= now, m
            # Either clock's offset left in would be 300 s or more: half the smaller one is room.
            assert 0 < m.downtime < min(AHEAD, -BEHIND) / 2, m
            # The job ran on each host's clock, as the host's processes do.
            assert [r.ending for r in rs] == ["checkpointed", "finished"]
            ended = next(r for r in records(c, "conv") if r.get("event") == "finished")
            assert abs(ended["ts"] - time.time() - BEHIND) < 60, ended
        finally:
            if c.manager is not None:  # a SIGTERMed manager waits out open long polls
                c.kill(c.manager)


async def test_an_agent_whose_clock_is_before_the_certificate_says_so_and_stays_up(
    net_hosts: Hosts, tmp_path: Path, preload: list[str]
) -> None:
    """A certificate issued a moment ago (backdated five minutes) is not yet valid on a clock
    seven minutes slow: the agent refuses the manager, says why, and keeps running."""
    hosts = net_hosts(2)
    tls = tls_for(tmp_path, hosts[0])
    slow = SkewedHost(hosts[1], BEHIND, tuple(preload))
    async with EmbeddedCluster(
        tmp_path / "c", workers=1, cpus_per_worker=0.5, hosts=[hosts[0], slow], tls=tls
    ) as c:
        try:
            agent = c.agents[WorkerId("w0")]

            def said_why() -> bool:
                return any(
                    '"specon.agent.tls_error"' in line and "not yet valid" in line
                    for line in agent.log_path.read_text(errors="replace").splitlines()
                )

            await wait_for(said_why, "the agent to log why it refuses the manager", timeout=30)
            h = await agent_health(agent)
            assert h is not None and h["ok"] and h["manager_connected"] is False, h
            st = await status(c)
            assert st is not None and not st.workers, "the manager heard from an agent that refused it"
        finally:
            if c.manager is not None:
                c.kill(c.manager)
