"""The node's unmanaged pods (``specon.runtime.kubernetes.others``): their requests summed as
the kube-scheduler does (``pod_requests``), which of the node's pods count, and the capacity
the runtime reports: the node's allocatable less those requests (issue 34: a restored copy sent
where unmanaged pods hold the CPU or the GPUs was refused by the kubelet). The real kubelet's
view is tests/k8s/test_real_nodes.py's."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest
import structlog

from specon.model import GPU_PRODUCT_LABEL, Resources
from specon.runtime.kubernetes import others
from specon.runtime.kubernetes.backend import KubeApi
from specon.runtime.kubernetes.pods import pod_requests
from tests.unit.runtime.kubernetes.test_backend import NS, api, create, manifest, runtime
from tests.unit.runtime.kubernetes.test_gpu_backend import gpu_manifest, node

__all__ = ["api"]  # the fixture, used by name

GI = 2**30


def container(name: str, requests: dict[str, Any] | None = None, **kw: Any) -> dict[str, Any]:
    c: dict[str, Any] = {"name": name, "image": "busybox", **kw}
    if requests is not None:
        c["resources"] = {"requests": requests}
    return c


def pod(
    name: str = "p",
    *,
    containers: list[dict[str, Any]] | None = None,
    init: list[dict[str, Any]] | None = None,
    node_name: str = "node-1",
    namespace: str = "kube-system",
    labels: dict[str, str] | None = None,
    phase: str = "Running",
    **spec: Any,
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "nodeName": node_name,
        "containers": containers if containers is not None else [container("c", {"cpu": "1"})],
        **spec,
    }
    if init:
        body["initContainers"] = init
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": dict(labels or {})},
        "spec": body,
        "status": {"phase": phase},
    }


# -- the scheduler's sum ---------------------------------------------------------------------------
def test_regular_containers_add_up() -> None:
    p = pod(containers=[container("a", {"cpu": "500m", "memory": "1Gi"}), container("b", {"cpu": "1.5"})])
    assert pod_requests(p) == Resources(cpu=2.0, memory=GI)


def test_limits_stand_in_for_missing_requests_and_gpus_count() -> None:
    c = container("a", {"cpu": "1"})
    c["resources"]["limits"] = {"cpu": "4", "memory": "2Gi", "nvidia.com/gpu": "2"}
    assert pod_requests(pod(containers=[c, container("b")])) == Resources(cpu=1.0, memory=2 * GI, gpu=2)


def test_an_init_container_counts_only_where_it_needs_more_than_the_containers() -> None:
    regular = [container("a", {"cpu": "1", "memory": "1Gi"}), container("b", {"cpu": "1"})]
    init = [container("setup", {"cpu": "3", "memory": "512Mi"}), container("more", {"memory": "3Gi"})]
    # Init containers run one at a time, before the others: each resource's peak.
    assert pod_requests(pod(containers=regular, init=init)) == Resources(cpu=3.0, memory=3 * GI)
    small = [container("setup", {"cpu": "100m", "nvidia.com/gpu": "1"})]
    assert pod_requests(pod(containers=regular, init=small)) == Resources(cpu=2.0, memory=GI, gpu=1)


def test_sidecars_run_beside_the_containers_and_the_later_init_containers() -> None:
    sidecar = container("proxy", {"cpu": "500m", "memory": "1Gi"}, restartPolicy="Always")
    init = [sidecar, container("migrate", {"cpu": "2"})]
    got = pod_requests(pod(containers=[container("a", {"cpu": "1"})], init=init))
    # max(1 + 0.5, 2 + 0.5 while "migrate" runs beside the sidecar) CPU; the sidecar's memory.
    assert got == Resources(cpu=2.5, memory=GI)


def test_the_runtime_class_overhead_adds_to_the_pod() -> None:
    p = pod(
        containers=[container("a", {"cpu": "1", "memory": "1Gi"})],
        overhead={"cpu": "250m", "memory": "120Mi"},
    )
    assert pod_requests(p) == Resources(cpu=1.25, memory=GI + 120 * 2**20)


def test_pod_level_resources_replace_the_containers_cpu_and_memory() -> None:
    c = container("a", {"cpu": "1", "memory": "1Gi"})
    c["resources"]["limits"] = {"nvidia.com/gpu": "1"}
    p = pod(containers=[c, container("b", {"cpu": "1"})], resources={"requests": {"cpu": "3"}})
    assert pod_requests(p) == Resources(cpu=3.0, memory=GI, gpu=1)


# -- which pods count ------------------------------------------------------------------------------
def managed_label(p: dict[str, Any]) -> bool:
    return p["metadata"]["labels"].get("specon.io/managed") == "true"


def test_only_unfinished_unmanaged_pods_bound_to_the_node_count() -> None:
    o = others.OtherPods(KubeApi.__new__(KubeApi), "node-1", managed=managed_label, watch=False)
    terminating = pod("t")
    terminating["metadata"]["deletionTimestamp"] = "2024-01-01T00:00:00Z"
    assert o.counted(pod("running")) and o.counted(pod("pending", phase="Pending"))
    assert o.counted(pod("unknown", phase="Unknown")) and o.counted(terminating)  # still holds it
    assert not o.counted(pod("done", phase="Succeeded")) and not o.counted(pod("failed", phase="Failed"))
    assert not o.counted(pod("elsewhere", node_name="node-2"))
    assert not o.counted(pod("managed", labels={"specon.io/managed": "true"}))  # the manager counts it


def test_a_namespaced_agent_counts_the_managed_pods_of_other_namespaces() -> None:
    """It reports only its namespace's pods, so the manager counts no other's."""
    o = others.OtherPods(
        KubeApi.__new__(KubeApi), "node-1", managed=managed_label, namespaces=(NS,), watch=False
    )
    labels = {"specon.io/managed": "true"}
    assert not o.counted(pod("mine", namespace=NS, labels=labels))
    assert o.counted(pod("theirs", namespace="team-b", labels=labels))


def test_the_remaining_capacity_is_never_negative() -> None:
    left = others.remaining(Resources(cpu=4.0, memory=8 * GI, gpu=2), Resources(cpu=5.0, memory=GI, gpu=2))
    assert left == Resources(cpu=0.0, memory=7 * GI, gpu=0)


# -- the capacity the runtime reports (kmock) ------------------------------------------------------
def unmanaged(name: str, requests: dict[str, Any], **kw: Any) -> dict[str, Any]:
    p = manifest(name, managed=False, **kw)
    p["spec"]["containers"][0]["resources"] = {"requests": requests}
    return p


@pytest.mark.parametrize("watch", [False, True])
async def test_the_capacity_is_the_allocatable_less_the_unmanaged_pods_requests(
    api: KubeApi, kmock: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, watch: bool
) -> None:
    await node(api, kmock, "node-1", "NVIDIA-H100-80GB-HBM3", 4)  # 16 CPUs, 64 GiB, 4 GPUs
    await create(api, gpu_manifest())  # managed (2 CPUs, 2 GPUs): the manager counts it
    await create(api, unmanaged("daemon", {"cpu": "500m", "memory": "1Gi"}))
    await create(api, unmanaged("other-team", {"cpu": "10", "memory": "8Gi", "nvidia.com/gpu": "1"}))
    await create(api, unmanaged("finished", {"cpu": "3"}, phase="Succeeded"))  # holds nothing
    await create(api, unmanaged("elsewhere", {"cpu": "3"}, node="node-2"))
    rt = runtime(api, tmp_path, watch=watch)
    try:
        with structlog.testing.capture_logs() as logs:
            first = (await rt.usage()).capacity
            assert (await rt.usage()).capacity == first
        assert first == Resources(cpu=5.5, memory=55 * GI, gpu=3)
        (event,) = [e for e in logs if e["event"] == "specon.k8s.unmanaged_requests"]  # once per change
        assert (event["node"], event["pods"], event["cpu"], event["gpu"]) == ("node-1", 2, 10.5, 1)
        assert rt.node_labels[GPU_PRODUCT_LABEL]  # the node object was read as before
        await asyncio.to_thread(api.request, "DELETE", f"/api/v1/namespaces/{NS}/pods/other-team")
        back = Resources(cpu=15.5, memory=63 * GI, gpu=4)
        deadline = time.monotonic() + 20
        while (await rt.usage()).capacity != back and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert (await rt.usage()).capacity == back
        if watch:  # a heartbeat reads the watch's cache: no API call
            assert rt._others is not None and rt._others.watch is not None and rt._others.watch.synced
            listed = []
            request = api.request

            def counting(method: str, path: str, **kw: Any) -> Any:
                listed.append(path)
                return request(method, path, **kw)

            monkeypatch.setattr(api, "request", counting)
            await create(api, unmanaged("late", {"cpu": "1"}))  # (one call, counted)
            while (await rt.usage()).capacity != back - Resources(cpu=1.0) and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            assert (await rt.usage()).capacity == back - Resources(cpu=1.0)
            assert others.ALL_PODS not in listed
    finally:
        rt.close()


async def test_unmanaged_pods_holding_more_than_the_node_leave_no_capacity(
    api: KubeApi, kmock: Any, tmp_path: Path
) -> None:
    await node(api, kmock, "node-1", "NVIDIA-H100-80GB-HBM3", 4)
    await create(api, unmanaged("hog", {"cpu": "20", "memory": "100Gi", "nvidia.com/gpu": "4"}))
    rt = runtime(api, tmp_path)
    assert (await rt.usage()).capacity == Resources()


# -- counted by the manager (ClusterRequests) ------------------------------------------------------
async def test_the_manager_takes_the_other_pods_requests_off_each_nodes_reported_capacity(
    api: KubeApi, kmock: Any
) -> None:
    """One watch of every pod; a pod counts as managed on its node when that node's heartbeat
    lists its job (a managed pod not listed yet, or of a namespace no agent manages, is
    another's); pods come and go through the watch, a pod that moves changes nodes."""
    allocatable = Resources(cpu=16.0, memory=64 * GI, gpu=4)
    reqs = others.ClusterRequests(api, "specon.io/managed=true")
    assert reqs.free("node-1", allocatable, []) == allocatable  # not listed yet: as reported
    await create(api, gpu_manifest())  # managed: 2 CPUs, 8 GiB, 2 GPUs; job NS.train on node-1
    await create(api, unmanaged("daemon", {"cpu": "500m", "memory": "1Gi"}))
    await create(api, unmanaged("elsewhere", {"cpu": "3"}, node="node-2"))
    await create(api, unmanaged("finished", {"cpu": "3"}, phase="Succeeded"))
    reqs.start()
    try:
        deadline = time.monotonic() + 20
        while not reqs.synced and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        job = f"{NS}.train"
        assert reqs.free("node-1", allocatable, [job]) == Resources(cpu=15.5, memory=63 * GI, gpu=4)
        assert reqs.free("node-1", allocatable, []) == Resources(cpu=13.5, memory=55 * GI, gpu=2)
        assert reqs.free("node-2", allocatable, []) == Resources(cpu=13.0, memory=64 * GI, gpu=4)
        assert reqs.free("node-3", allocatable, []) == allocatable
        await asyncio.to_thread(api.request, "DELETE", f"/api/v1/namespaces/{NS}/pods/daemon")
        while reqs.free("node-1", allocatable, [job]) != allocatable and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert reqs.free("node-1", allocatable, [job]) == allocatable
    finally:
        reqs.stop()


def test_the_index_follows_a_pod_that_changes_node_or_ends() -> None:
    reqs = others.ClusterRequests(KubeApi.__new__(KubeApi), "specon.io/managed=true", watch=False)
    cap = Resources(cpu=8.0)
    reqs.reset({("a", "p"): pod("p", node_name="node-1")})

    class Synced:
        synced = True

    reqs.watch = Synced()  # type: ignore[assignment]
    assert reqs.free("node-1", cap, []) == Resources(cpu=7.0)
    reqs.put(("a", "p"), pod("p", node_name="node-2"))
    assert reqs.free("node-1", cap, []) == cap and reqs.free("node-2", cap, []) == Resources(cpu=7.0)
    reqs.put(("a", "p"), pod("p", node_name="node-2", phase="Succeeded"))
    assert reqs.free("node-2", cap, []) == cap
    reqs.put(("a", "q"), pod("q", node_name="node-2"))
    reqs.put(("a", "q"), None)
    assert reqs.free("node-2", cap, []) == cap
