"""GPU jobs on a real kube-apiserver (issue 22), with the kubelet stand-in running each pod's
command as a local process (no GPU anywhere: what is checked is the API side and the freezer).

Nodes advertise ``nvidia.com/gpu`` in their status (capacity and allocatable, patched as the
device plugin does) and GPU feature discovery's ``nvidia.com/gpu.product`` label. A GPU pod's
spec comes back with its GPU request, memory need and product pin; the manager's placement
offers it only a node of its product with enough GPUs; its save records the pin, a start on
another product is refused, and the copy the API server accepts keeps its limits and gains the
product selector. Then a pod's cgroup freezer on this machine (cgroup v1) with a real process:
frozen, its host PID found, and thawed by the save so it checkpoints on SIGTERM.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from specon_agent.core import Agent
from specon_manager.journal import Journal
from specon_manager.shell import recover

from specon import checkpoint as ckpt
from specon.config import default_policy
from specon.coordinator.inline import InlineCoordinator
from specon.model import (
    GPU_MEMORY_LABEL,
    GPU_MEMORY_NEED_LABEL,
    GPU_PRODUCT_LABEL,
    Category,
    ContainerId,
    ContainerSnapshot,
    Resources,
    WorkerSnapshot,
)
from specon.policy.placement import fits
from specon.runtime.base import StartFailed
from specon.runtime.kubernetes.backend import KubeApi, KubernetesRuntime
from specon.runtime.kubernetes.restore import record_name
from specon.wire.protocol import Action, CommandBatch, Heartbeat, ReallocationRequest
from tests.k8s.cluster import KubeCluster
from tests.k8s.kubelet import FakeKubelet, NodeSpec
from tests.k8s.test_manifests import MANIFESTS, render
from tests.k8s.test_runtime_kubernetes import admin, create, running, trained, training_pod, until, volume

__all__ = ["admin", "volume"]  # fixtures used by name below

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(180)]

H100, A100 = "NVIDIA-H100-80GB-HBM3", "NVIDIA-A100-SXM4-40GB"
SOURCE, SAME, OTHER, FEW = "gpu-src", "gpu-same", "gpu-other", "gpu-few"
# (node, product, GPUs allocatable, MiB per GPU); OTHER is the emptiest and biggest, but of
# another product; FEW has the product but one GPU.
GPUS = {SOURCE: (H100, 2, 81559), SAME: (H100, 2, 81559), OTHER: (A100, 8, 81920), FEW: (H100, 1, 81559)}
NODES = tuple(
    NodeSpec(
        name,
        cpu="16" if name == OTHER else "8",
        address=f"127.0.0.{31 + i}",
        labels={GPU_PRODUCT_LABEL: product, GPU_MEMORY_LABEL: str(mib)},
    )
    for i, (name, (product, _, mib)) in enumerate(GPUS.items())
)


def advertise_gpus(api: KubeApi) -> None:
    """What NVIDIA's device plugin does: the node's status gains ``nvidia.com/gpu``."""
    for name, (_, gpus, _) in GPUS.items():
        node = api.request("GET", f"/api/v1/nodes/{name}")
        status = {k: {**node["status"][k], "nvidia.com/gpu": str(gpus)} for k in ("capacity", "allocatable")}
        api.request(
            "PATCH",
            f"/api/v1/nodes/{name}/status",
            body={"status": status},
            content_type="application/merge-patch+json",
        )


@pytest.fixture
def kubelet(
    kube_cluster: KubeCluster, kube_namespace: str, tmp_path: Path, admin: KubeApi
) -> Iterator[FakeKubelet]:
    with FakeKubelet(kube_cluster, NODES, workdir=tmp_path / "kubelet") as k:
        advertise_gpus(admin)
        yield k


@pytest.fixture
async def runtimes(
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


def gpu_pod(name: str, gpus: int = 2, **kw: Any) -> dict[str, Any]:
    pod = training_pod(
        name, SOURCE, steps=5000, step_seconds=0.02, annotations={GPU_MEMORY_NEED_LABEL: "40Gi"}, **kw
    )
    pod["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": gpus}}
    return pod


def _decide(tmp_path: Path, heartbeats: list[Heartbeat], container: ContainerId) -> CommandBatch:
    journal = Journal(tmp_path / "journal.db")
    coord = InlineCoordinator(
        policy=default_policy(), journal=journal, clock=time.time, recovered=recover(journal, time.time())
    )
    for hb in heartbeats:
        coord.on_heartbeat(hb)
    req = ReallocationRequest(worker=SOURCE, container=container, t_cc=0.0, g=0.001, sent_at=coord.clock())
    return coord.on_request(req)


async def test_gpu_pods_are_placed_by_product_and_count_and_restored_pinned(
    admin: KubeApi, kube_namespace: str, volume: Path, runtimes: dict[str, KubernetesRuntime], tmp_path: Path
) -> None:
    job = ContainerId(f"{kube_namespace}.gpujob")
    await create(admin, kube_namespace, gpu_pod("gpujob"))
    src = runtimes[SOURCE]
    await until(lambda: running(src, "gpujob"), "the GPU job running")

    # The API server keeps the extended resource as a limit and defaults the request to it.
    pod = admin.request("GET", f"/api/v1/namespaces/{kube_namespace}/pods/gpujob")
    resources = pod["spec"]["containers"][0]["resources"]
    assert resources == {"limits": {"nvidia.com/gpu": "2"}, "requests": {"nvidia.com/gpu": "2"}}

    # The runtime reads the node's GPUs and the job's request, memory and product pin.
    for rt in runtimes.values():
        await rt.usage()
    assert (await src.usage()).capacity.gpu == 2 and (await runtimes[OTHER].usage()).capacity.gpu == 8
    assert src.node_labels[GPU_PRODUCT_LABEL] == H100
    (info,) = await src.list_containers()
    assert (info.spec.requests.gpu, info.spec.gpu_memory) == (2, 40 * 2**30)
    assert info.spec.selector == ((GPU_PRODUCT_LABEL, H100),)

    # Agents carry it to the manager, whose placement offers only SAME.
    agents = {
        name: Agent(runtime=rt, policy=default_policy(), address=f"{name}:7701")
        for name, rt in runtimes.items()
    }
    heartbeats = []
    for agent in agents.values():
        await agent.refresh()
        await agent.sample_usage()
        heartbeats.append(agent.heartbeat(agent.runtime.now()))
    by_worker = {hb.worker: hb for hb in heartbeats}
    (report,) = by_worker[SOURCE].containers
    assert report.selector == {GPU_PRODUCT_LABEL: H100} and report.gpu_memory == 40 * 2**30
    snapshot = ContainerSnapshot(
        id=job,
        worker=by_worker[SOURCE].worker,
        category=Category.CONVERGED,
        requests=report.requests,
        selector=tuple(report.selector.items()),
        gpu_memory=report.gpu_memory,
    )
    feasible = {
        name: fits(
            snapshot,
            WorkerSnapshot(id=hb.worker, capacity=hb.capacity, labels=tuple(sorted(hb.labels.items()))),
            Resources(),
        )
        for name, hb in by_worker.items()
        if name != SOURCE
    }
    assert feasible == {SAME: True, OTHER: False, FEW: False}
    save = [c for c in _decide(tmp_path, heartbeats, job).commands if c.action is Action.SAVE]
    assert [c.target for c in save] == [SAME]
    for agent in agents.values():
        for w in agent.watched.values():
            w.tailer.close()

    # The save records the pin; the restore keeps the limits and the product, never elsewhere.
    await until(lambda: len(trained(volume, "gpujob")) > 30, "a few steps")
    result = await src.save(job, grace=10)
    assert not result.forced and result.checkpoint is not None
    record = admin.request("GET", f"/api/v1/namespaces/{kube_namespace}/podtemplates/{record_name(job)}")
    assert record["template"]["spec"]["nodeSelector"] == {GPU_PRODUCT_LABEL: H100}
    with pytest.raises(StartFailed, match=f"GPU product {H100}"):
        await runtimes[OTHER].start(info.spec, checkpoint=result.checkpoint)
    started = await runtimes[SAME].start(info.spec, checkpoint=result.checkpoint)
    copy = admin.request("GET", f"/api/v1/namespaces/{kube_namespace}/pods/{started.handle.split('/')[1]}")
    assert copy["spec"]["nodeName"] == SAME
    assert copy["spec"]["nodeSelector"] == {GPU_PRODUCT_LABEL: H100}
    assert copy["spec"]["containers"][0]["resources"] == resources
    await until(lambda: running(runtimes[SAME], "gpujob"), "the copy running on the same product")
    (moved,) = await runtimes[SAME].list_containers()
    assert moved.spec.requests.gpu == 2 and moved.spec.selector == ((GPU_PRODUCT_LABEL, H100),)


def test_the_gpu_components_agent_applies_server_side(admin: KubeApi, tmp_path: Path) -> None:
    rel = os.path.relpath(MANIFESTS, tmp_path)
    (tmp_path / "kustomization.yaml").write_text(
        f"resources: [{rel}]\ncomponents: [{rel}/components/cpu-weights, {rel}/components/gpu]\n"
    )
    (agent,) = [d for d in render(tmp_path) if d["kind"] == "DaemonSet"]
    with contextlib.suppress(Exception):  # exists already (another test made it): fine
        admin.request("POST", "/api/v1/namespaces", body={"metadata": {"name": "specon"}})
    made = admin.request(
        "POST", "/apis/apps/v1/namespaces/specon/daemonsets", query={"dryRun": "All"}, body=agent
    )
    assert made["spec"]["template"]["spec"]["hostPID"] is True


# -- the freezer on this machine's cgroups -------------------------------------------------------
CGROUP = Path("/sys/fs/cgroup")


def v1_freezer_or_skip() -> None:
    if (CGROUP / "cgroup.controllers").exists():
        pytest.skip("this test lays out cgroup v1 pod groups; the machine runs cgroup v2")
    for hierarchy in ("cpu", "freezer"):
        if not os.access(CGROUP / hierarchy, os.W_OK):
            pytest.skip(f"needs {CGROUP / hierarchy} writable (root, cgroup v1)")


@contextlib.contextmanager
def pod_groups(uid: str, pid: int) -> Iterator[Path]:
    """The pod's groups as a kubelet makes them (cgroupfs driver, BestEffort), below a root of
    our own, with the pod's process moved in; everything removed afterwards."""
    top = f"specon-gpu-{uuid.uuid4().hex[:8]}"
    made = []
    try:
        for hierarchy in ("cpu", "freezer"):
            group = CGROUP / hierarchy / top / "kubepods" / "besteffort" / f"pod{uid}" / "ctr"
            group.mkdir(parents=True)
            made.append(CGROUP / hierarchy / top)
            (group / "cgroup.procs").write_text(str(pid))
        yield CGROUP / "freezer" / top / "kubepods" / "besteffort" / f"pod{uid}"
    finally:
        for root in made:
            with contextlib.suppress(OSError):
                state = root / "kubepods" / "besteffort" / f"pod{uid}" / "freezer.state"
                if state.exists():
                    state.write_text("THAWED")
            for d in sorted(
                (p for p in root.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True
            ):
                with contextlib.suppress(OSError):
                    for task in (d / "cgroup.procs").read_text().split():
                        (root.parent / "cgroup.procs").write_text(task)
                    d.rmdir()
            with contextlib.suppress(OSError):
                root.rmdir()


async def test_a_frozen_pod_stops_shows_its_host_pid_and_is_thawed_to_save(
    admin: KubeApi,
    kube_namespace: str,
    volume: Path,
    runtimes: dict[str, KubernetesRuntime],
    kubelet: FakeKubelet,
) -> None:
    v1_freezer_or_skip()
    job = ContainerId(f"{kube_namespace}.frozen")
    await create(admin, kube_namespace, gpu_pod("frozen", gpus=1))
    src = runtimes[SOURCE]
    await until(lambda: running(src, "frozen"), "the job running")
    await until(lambda: len(trained(volume, "frozen")) > 10, "a few steps")
    pid = kubelet.pid(kube_namespace, "frozen")
    assert pid is not None
    uid = admin.request("GET", f"/api/v1/namespaces/{kube_namespace}/pods/frozen")["metadata"]["uid"]
    rt = KubernetesRuntime(
        admin.client, SOURCE, volume_root=volume, namespace=kube_namespace, kill_slack=5.0, cgroup_root=CGROUP
    )
    try:
        with pod_groups(uid, pid) as group:
            assert (await rt.pids()).get(job) == frozenset({pid})
            assert await rt.freeze(job)
            assert (group / "freezer.state").read_text().strip() == "FROZEN"
            steps = len(trained(volume, "frozen"))
            await asyncio.sleep(1.0)  # 50 steps' time: not one may pass while frozen
            assert len(trained(volume, "frozen")) == steps
            result = await rt.save(job, grace=10)  # thaws first, else SIGTERM waits to SIGKILL
            assert not result.forced and result.step is not None and result.step >= steps
            assert job not in await rt.pids()
    finally:
        rt.close()
    assert ckpt.latest_complete(volume / "jobs" / "frozen" / "checkpoints") is not None
