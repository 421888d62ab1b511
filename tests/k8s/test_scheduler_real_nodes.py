"""Restores through kube-scheduler on the real kubelet nodes (``nodes.py``; the cluster runs
the real kube-scheduler v1.20.2, ``cluster.py``).

A restored copy is created unbound, steered to its target by a required node affinity
(``steering``): the scheduler binds one that fits (every move of tests/k8s/test_real_nodes.py
does), and leaves one that does not fit Pending, so no kubelet ever refuses it; the agent
withdraws it past ``--placement-deadline`` and the manager rolls the move back, again through
the scheduler, with the scheduler's reason in the journal.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from specon.coordinator.migration import State
from specon.runtime.kubernetes.backend import KubeApi
from specon.runtime.kubernetes.pods import node_capacity
from specon.runtime.kubernetes.steering import ANN_STEERED
from specon.testing.held_jobs import release, release_file
from tests.k8s.cluster import KubeCluster
from tests.k8s.nodes import RealNodes, on_real_node
from tests.k8s.test_e2e_kubernetes import (
    both_agents,
    converging,
    deployed,
    finished,
    migration_of,
    steady,
    submit,
)
from tests.k8s.test_real_nodes import sleeper, trained_exactly
from tests.k8s.test_runtime_kubernetes import held, until

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(300)]

DEADLINE_S = 8  # the agents' --placement-deadline: a copy Pending this long is withdrawn
STEPS = 300


async def test_a_copy_that_does_not_fit_stays_pending_and_the_move_rolls_back_losing_no_step(
    real_cluster: KubeCluster, real_namespace: str, real_nodes: RealNodes, tmp_path: Path
) -> None:
    """The target's CPU is taken by another team's pod after the manager chose it (while the
    source saves): the copy stays Pending, never reaching the kubelet, and the job resumes on
    its source from the checkpoint its save wrote, every step trained exactly once."""
    args = ("--placement-deadline", str(DEADLINE_S))
    async with deployed(real_cluster, real_namespace, tmp_path, adapt=on_real_node, agent_args=args) as d:
        admin = KubeApi(real_cluster.api_client())
        job = f"{d.namespace}.fit"
        await until(both_agents(d), "both agents heartbeating", timeout=120)
        # The save is held at its gate until node-2 is full (55 s at most, within the grace).
        gate = d.volume / "jobs" / "fit" / "save-gate"
        hold = ("--save-seconds", "55", "--save-gate", "/data/jobs/fit/save-gate", *held("fit"))
        pod = converging("fit", STEPS, extra=hold)
        pod["spec"]["terminationGracePeriodSeconds"] = 60
        pod["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "500m"}}
        await submit(d, pod)
        await submit(d, steady("steady", 800))

        def saving() -> object:
            return next(
                (m for m in d.journal().in_flight() if m.container == job and m.state is State.SAVING), None
            )

        m = await until(saving, "the save to begin", timeout=120)
        assert (m.source, m.target) == ("node-1", "node-2")
        cpu = node_capacity(admin.request("GET", "/api/v1/nodes/node-2")).cpu
        taken = int(cpu * 1000) - 100  # leaves 0.1 CPU: the copy asks for 0.5
        admin.request(
            "POST",
            f"/api/v1/namespaces/{d.namespace}/pods",
            body=sleeper("other", "node-2", {"cpu": f"{taken}m"}),
        )
        gate.touch()

        await until(
            migration_of(d, job, lambda x: x.state.value == "rolled_back"),
            "the move to roll back",
            timeout=150,
        )
        (record,) = [r for r in d.journal().all() if r.container == job]
        # The scheduler's own reason, from the copy that stayed Pending (never a kubelet's
        # OutOfcpu: that would be a pod bound and refused).
        assert "Insufficient cpu" in (record.error or "") and "withdrawn" in (record.error or ""), (
            record.error
        )
        # The rollback's copy, steered to the source and bound there by the scheduler; it takes
        # the withdrawn copy's name and generation (that one never ran).
        (back,) = [p for p in admin.request("GET", f"/api/v1/namespaces/{d.namespace}/pods")["items"]
                   if p["metadata"]["labels"].get("specon.io/job") == "fit"]  # fmt: skip
        assert back["metadata"]["name"] == "fit-g2" and back["spec"]["nodeName"] == "node-1"
        assert back["metadata"]["annotations"][ANN_STEERED] == "node-1"

        release(release_file(d.volume, "fit"))
        await until(lambda: finished(d.volume, "fit"), "the job to finish on its source", timeout=120)
        trained_exactly(d.volume, "fit", STEPS)
