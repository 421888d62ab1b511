"""Taints, tolerations and node selectors from a real kube-apiserver to the manager's choice.

Nodes are API objects served by the kubelet stand-in: one plain source node and one node
tainted ``gpu=a100:NoSchedule``. The Kubernetes runtime reports the node's taints and each
pod's tolerations and nodeSelector; agents carry them in heartbeats; the coordinator offers
the tainted node only to a pod that tolerates its taint (and whose selector it matches).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from specon_agent.core import Agent
from specon_manager.journal import Journal
from specon_manager.shell import recover

from specon.config import default_policy
from specon.coordinator.inline import InlineCoordinator
from specon.model import ContainerId
from specon.runtime.kubernetes.backend import KubeApi, KubernetesRuntime
from specon.runtime.kubernetes.pods import TAINT_NOT_READY
from specon.wire.protocol import Action, CommandBatch, Heartbeat, ReallocationRequest
from tests.k8s.cluster import KubeCluster
from tests.k8s.kubelet import FakeKubelet, NodeSpec, Taint
from tests.k8s.test_runtime_kubernetes import admin, create, running, training_pod, until, volume

__all__ = ["admin", "volume"]  # fixtures used by name below

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(180)]

SOURCE, GPU = "plc-source", "plc-gpu"
NODES = (
    NodeSpec(SOURCE, address="127.0.0.21", labels={"zone": "a"}),
    NodeSpec(
        GPU,
        address="127.0.0.22",
        labels={"zone": "a"},
        # PreferNoSchedule is only a preference: it never keeps a pod off, so it is not reported.
        taints=(Taint("gpu", "a100", "NoSchedule"), Taint("spot", "", "PreferNoSchedule")),
    ),
)
GPU_TOLERATION = {"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}


@pytest.fixture
def kubelet(kube_cluster: KubeCluster, kube_namespace: str, tmp_path: Path) -> Iterator[FakeKubelet]:
    with FakeKubelet(kube_cluster, NODES, workdir=tmp_path / "kubelet") as k:
        yield k


@pytest.fixture
async def placed_runtimes(
    kube_cluster: KubeCluster, kube_namespace: str, volume: Path, kubelet: FakeKubelet
) -> AsyncIterator[dict[str, KubernetesRuntime]]:
    made = {
        node.name: KubernetesRuntime(
            kube_cluster.api_client(), node.name, volume_root=volume, namespace=kube_namespace, kill_slack=5.0
        )
        for node in NODES
    }
    yield made
    for rt in made.values():
        rt.close()


def _pod(
    name: str, *, tolerations: list[dict[str, Any]] | None = None, selector: dict[str, str] | None = None
) -> dict[str, Any]:
    pod = training_pod(name, SOURCE, steps=5000, step_seconds=0.05)
    if tolerations is not None:
        pod["spec"]["tolerations"] = tolerations
    if selector is not None:
        pod["spec"]["nodeSelector"] = selector
    return pod


def _decide(tmp_path: Path, heartbeats: list[Heartbeat], namespace: str, job: str) -> CommandBatch:
    """A fresh manager hears ``heartbeats``, then the source asks to move ``job``."""
    journal = Journal(tmp_path / f"journal-{job}.db")
    coord = InlineCoordinator(
        policy=default_policy(), journal=journal, clock=time.time, recovered=recover(journal, time.time())
    )
    for hb in heartbeats:
        coord.on_heartbeat(hb)
    req = ReallocationRequest(
        worker=SOURCE, container=ContainerId(f"{namespace}.{job}"), t_cc=0.0, g=0.001, sent_at=coord.clock()
    )
    return coord.on_request(req)


async def test_a_tainted_node_is_offered_only_to_pods_that_tolerate_it(
    admin: KubeApi,
    kube_namespace: str,
    placed_runtimes: dict[str, KubernetesRuntime],
    tmp_path: Path,
) -> None:
    await create(
        admin, kube_namespace, _pod("tolerant", tolerations=[GPU_TOLERATION], selector={"zone": "a"})
    )
    await create(admin, kube_namespace, _pod("plain"))
    # Tolerates everything, but selects a zone the GPU node is not in.
    await create(
        admin, kube_namespace, _pod("elsewhere", tolerations=[{"operator": "Exists"}], selector={"zone": "b"})
    )
    src, gpu = placed_runtimes[SOURCE], placed_runtimes[GPU]
    for job in ("tolerant", "plain", "elsewhere"):
        await until(lambda job=job: running(src, job), f"{job} running on {SOURCE}")  # type: ignore[misc]

    async def ready(rt: KubernetesRuntime) -> bool:
        await rt.usage()  # reads the node object (capacity, labels, taints)
        return not any(t.startswith(TAINT_NOT_READY) for t in rt.node_taints)

    for name, rt in placed_runtimes.items():
        await until(lambda rt=rt: ready(rt), f"{name} Ready")  # type: ignore[misc]

    # The runtime reports what placement needs, from the API objects.
    assert gpu.node_taints == ("gpu=a100:NoSchedule",)
    assert src.node_taints == ()
    specs = {info.id.partition(".")[2]: info.spec for info in await src.list_containers()}
    assert (specs["tolerant"].tolerations, specs["tolerant"].selector) == (
        ("gpu:NoSchedule",),
        (("zone", "a"),),
    )
    assert (specs["plain"].tolerations, specs["plain"].selector) == ((), ())
    assert specs["elsewhere"].tolerations == ("*",)

    # Agents carry it to the manager.
    agents = {
        name: Agent(runtime=rt, policy=default_policy(), address=f"{name}:7701")
        for name, rt in placed_runtimes.items()
    }
    heartbeats = []
    for agent in agents.values():
        await agent.refresh()
        await agent.sample_usage()
        heartbeats.append(agent.heartbeat(agent.runtime.now()))
    by_worker = {hb.worker: hb for hb in heartbeats}
    assert by_worker[GPU].taints == ("gpu=a100:NoSchedule",)
    reports = {r.id.partition(".")[2]: r for r in by_worker[SOURCE].containers}
    assert reports["tolerant"].tolerations == ("gpu:NoSchedule",)
    assert reports["tolerant"].selector == {"zone": "a"}

    # The GPU node is the emptier one: the pod that tolerates its taint is sent there ...
    save = [
        c
        for c in _decide(tmp_path, heartbeats, kube_namespace, "tolerant").commands
        if c.action is Action.SAVE
    ]
    assert [c.target for c in save] == [GPU]
    # ... the others never are: it is their only other node, so they stay.
    for job in ("plain", "elsewhere"):
        reply = _decide(tmp_path, heartbeats, kube_namespace, job)
        assert [c.action for c in reply.commands] == [Action.MARK_MIGRATED], job
        assert reply.commands[0].target is None

    for agent in agents.values():
        for w in agent.watched.values():
            w.tailer.close()
