"""Manager failover on Kubernetes: SIGKILL of the leader -> the standby's first decision (target <= 15 s).

Each run is ``tests/k8s/test_failover.py``'s scenario on a real kube-apiserver (built and
cached by ``tests/k8s/build-apiserver.sh``): two ``specon-manager --leader-elect`` replicas
with the default lease settings (8 s lease, 5 s renew deadline, 1 s retry), a TCP proxy
standing in for the HA component's Service (it routes to a replica that answers ``/healthz``
and whose pod object carries the leader's label, probed every 0.2 s), two local-runtime
agents behind it, a converged job whose save is held in
flight when the leader is SIGKILLed. Times from the SIGKILL, on this machine's clock, from
the processes' own JSON logs:

* lease taken  - the standby logs ``specon.manager.leader_acquired``;
* heartbeat    - an agent logs ``specon.agent.manager_connected`` (its first heartbeat the
  new leader accepted);
* decision     - the new leader's first decision (a command queued for the held migration,
  or a migration moved on).

Measured with the agents' heartbeat interval at the tests' 0.5 s and at the policy's default
5 s (``HEARTBEATS``). Each run also checks what the test checks (the migration ends, the job
trains exactly its steps, saved once). Median of 5 runs each (1 with ``--quick``); the target
is judged on the median decision time.
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
from pathlib import Path

from specon_manager.lease import Timing

from bench.figures import Figure
from tests.k8s.cluster import KubeCluster, ensure_binaries
from tests.k8s.test_failover import Failover, kill_the_leader_mid_migration, replicas

TARGET = 15.0
# The agents' heartbeat interval: the tests' 0.5 s, and the policy's default 5 s (an agent
# retries a failed heartbeat within one interval, so it bounds how soon the new leader hears).
HEARTBEATS = (0.5, 5.0)


async def _runs(n: int, root: Path) -> dict[float, list[Failover]]:
    out: dict[float, list[Failover]] = {}
    with KubeCluster(ensure_binaries(), authorization_mode="AlwaysAllow") as cluster:
        for heartbeat in HEARTBEATS:
            for i in range(n):
                with cluster.temporary_namespace("failover") as ns:
                    run_root = root / f"hb{heartbeat:g}-run-{i}"
                    async with replicas(cluster, ns, run_root, heartbeat=heartbeat, show_logs=False) as r:
                        f = await kill_the_leader_mid_migration(r)
                print(
                    f"  heartbeat {heartbeat:g} s, run {i + 1}/{n}: lease taken {f.acquired:.2f} s, first "
                    f"heartbeat {f.heartbeat:.2f} s, first decision {f.decision:.2f} s "
                    f"({f.migration.state.value})",
                    flush=True,
                )
                out.setdefault(heartbeat, []).append(f)
    return out


def run(quick: bool = False) -> list[Figure]:
    n = 1 if quick else 5
    with tempfile.TemporaryDirectory(prefix="bench-failover-") as tmp:
        runs = asyncio.run(_runs(n, Path(tmp)))
    t = Timing()
    lease = (
        f"lease {t.lease_duration:g} s / renew deadline {t.renew_deadline:g} s / retry {t.retry_period:g} s"
    )

    def figure(name: str, values: list[float], target: float | None = None) -> Figure:
        detail = f"median of {n}; {min(values):.2f}-{max(values):.2f} s; {lease}"
        return Figure(name, statistics.median(values), "s", target=target, detail=detail)

    out = []
    for heartbeat, fs in runs.items():
        beat = f"(hb {heartbeat:g} s)"
        out += [
            figure(f"failover {beat}: SIGKILL -> lease taken", [f.acquired for f in fs]),
            figure(f"failover {beat}: SIGKILL -> first heartbeat accepted", [f.heartbeat for f in fs]),
            figure(f"failover {beat}: SIGKILL -> first decision", [f.decision for f in fs], TARGET),
        ]
    return out
