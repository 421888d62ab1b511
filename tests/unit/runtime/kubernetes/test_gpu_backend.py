"""GPU jobs through KubernetesRuntime against kmock (an in-process Kubernetes emulator): the
spec the agent reports (GPU request, memory, the product pin), the restore record and the copy
(limits kept, product pinned, another product refused), and the freezer around a save. The
real API server's checks are in tests/k8s/test_gpu_kubernetes.py."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from specon import checkpoint as ckpt
from specon.model import (
    GPU_ANY_PRODUCT_LABEL,
    GPU_MEMORY_LABEL,
    GPU_MEMORY_NEED_LABEL,
    GPU_PRODUCT_LABEL,
    ContainerId,
    Resources,
)
from specon.runtime.base import StartFailed
from specon.runtime.kubernetes.backend import KubeApi
from specon.runtime.kubernetes.pods import job_spec
from specon.runtime.kubernetes.restore import record_name
from tests.unit.runtime.kubernetes.test_backend import NS, api, create, evictions, manifest, pods, runtime

__all__ = ["api"]  # the fixture, used by name

pytest.importorskip("kmock")

H100, A100 = "NVIDIA-H100-80GB-HBM3", "NVIDIA-A100-SXM4-40GB"
JOB = ContainerId(f"{NS}.train")


def gpu_manifest(name: str = "train", *, gpus: int = 2, **kw: Any) -> dict[str, Any]:
    pod = manifest(name, job="train", **kw)
    pod["spec"]["containers"][0]["resources"] = {
        "limits": {"cpu": "2", "memory": "8Gi", "nvidia.com/gpu": gpus}
    }
    return pod


async def node(api: KubeApi, kmock: Any, name: str, product: str, gpus: int) -> None:
    kmock.resources["v1/nodes"] = {"namespaced": False}
    body = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {GPU_PRODUCT_LABEL: product, GPU_MEMORY_LABEL: "81559"}},
        "status": {"allocatable": {"cpu": "16", "memory": "64Gi", "nvidia.com/gpu": str(gpus)}},
    }
    await asyncio.to_thread(api.request, "POST", "/api/v1/nodes", body=body)


async def test_the_reported_spec_carries_the_gpus_memory_and_the_product_pin(
    api: KubeApi, kmock: Any, tmp_path: Path
) -> None:
    await node(api, kmock, "node-1", H100, 4)
    await create(api, gpu_manifest(annotations={GPU_MEMORY_NEED_LABEL: "40Gi"}))
    rt = runtime(api, tmp_path)
    usage = await rt.usage()  # reads the node object
    assert usage.capacity == Resources(cpu=16.0, memory=64 * 2**30, gpu=4)
    assert rt.node_labels[GPU_PRODUCT_LABEL] == H100
    (info,) = await rt.list_containers()
    spec = info.spec
    assert (spec.requests.gpu, spec.gpu_memory) == (2, 40 * 2**30)
    assert spec.selector == ((GPU_PRODUCT_LABEL, H100),)
    assert spec.template is not None and H100 in spec.template  # what a restore would make


async def test_a_job_that_allows_any_product_is_not_pinned(api: KubeApi, kmock: Any, tmp_path: Path) -> None:
    await node(api, kmock, "node-1", H100, 4)
    pod = gpu_manifest(annotations={GPU_ANY_PRODUCT_LABEL: "true"})
    await create(api, pod)
    rt = runtime(api, tmp_path)
    await rt.usage()
    (info,) = await rt.list_containers()
    assert info.spec.selector == () and info.spec.requests.gpu == 2


async def save_with_kubelet(api: KubeApi, kmock: Any, tmp_path: Path, rt: Any, check: Any = None) -> None:
    """Save JOB while playing the kubelet and the job: on the eviction, ``check`` (what the
    pod's state must be then), a checkpoint, and the pod goes."""
    ckpt_dir = tmp_path / "jobs" / "train" / "checkpoints"
    seen = evictions(kmock, "train")

    async def kubelet() -> None:
        while not seen:
            await asyncio.sleep(0.01)
        if check is not None:
            check()
        ckpt.write(ckpt_dir, 25, b"state")
        await asyncio.to_thread(api.request, "DELETE", f"/api/v1/namespaces/{NS}/pods/train")

    task = asyncio.create_task(kubelet())
    result = await rt.save(JOB, grace=5)
    await task
    assert result.step == 25 and not result.forced


async def test_restore_keeps_the_limits_pins_the_product_and_refuses_another(
    api: KubeApi, kmock: Any, tmp_path: Path
) -> None:
    for name, product in (("node-1", H100), ("node-2", H100), ("node-3", A100)):
        await node(api, kmock, name, product, 8)
    original = gpu_manifest()
    await create(api, original)
    src = runtime(api, tmp_path)
    await src.usage()
    await save_with_kubelet(api, kmock, tmp_path, src)
    record = await asyncio.to_thread(
        api.request, "GET", f"/api/v1/namespaces/{NS}/podtemplates/{record_name(JOB)}"
    )
    assert record["template"]["spec"]["nodeSelector"] == {GPU_PRODUCT_LABEL: H100}
    saved = ckpt.latest_complete(tmp_path / "jobs" / "train" / "checkpoints")
    assert saved is not None

    other = runtime(api, tmp_path, node="node-3")
    with pytest.raises(StartFailed, match=f"GPU product {H100}.*{A100}"):
        await other.start(job_spec(original), checkpoint=saved.manifest)
    assert await pods(api) == {}  # nothing created

    info = await runtime(api, tmp_path, node="node-2").start(job_spec(original), checkpoint=saved.manifest)
    created = (await pods(api))["train-g2"]
    assert created["spec"]["nodeName"] == "node-2"
    assert created["spec"]["containers"][0]["resources"] == original["spec"]["containers"][0]["resources"]
    assert created["spec"]["nodeSelector"] == {GPU_PRODUCT_LABEL: H100}
    assert info.spec.requests.gpu == 2 and (GPU_PRODUCT_LABEL, H100) in info.spec.selector


def pod_freezer_tree(root: Path, uid: str) -> Path:
    """A v1 node's cgroups with the pod's group (Guaranteed: right below kubepods)."""
    for hierarchy in ("cpu", "freezer"):
        (root / hierarchy / "kubepods" / f"pod{uid}" / "ctr").mkdir(parents=True)
        (root / hierarchy / "cgroup.procs").write_text("")
    (root / "cpu" / "cpu.shares").write_text("1024\n")
    (root / "cpu" / "kubepods" / f"pod{uid}" / "ctr" / "cgroup.procs").write_text("4242\n")
    state = root / "freezer" / "kubepods" / f"pod{uid}" / "freezer.state"
    state.write_text("THAWED\n")
    return state


async def test_a_frozen_pod_is_thawed_before_its_save_signals_it(
    api: KubeApi, kmock: Any, tmp_path: Path
) -> None:
    await node(api, kmock, "node-1", H100, 8)
    await create(api, gpu_manifest())
    state = pod_freezer_tree(tmp_path / "cgroup", "uid-train")
    proc = tmp_path / "proc"
    (proc / "self").mkdir(parents=True)
    (proc / "self" / "status").write_text("NSpid:\t4242\n")
    rt = runtime(api, tmp_path, cgroup_root=tmp_path / "cgroup", proc=proc)
    assert await rt.pids() == {JOB: frozenset({4242})}
    assert await rt.freeze(JOB) and state.read_text() == "FROZEN"
    assert not await rt.freeze(ContainerId(f"{NS}.nowhere"))

    def thawed_at_the_eviction() -> None:
        assert state.read_text() == "THAWED"

    await save_with_kubelet(api, kmock, tmp_path, rt, thawed_at_the_eviction)
    assert await rt.pids() == {}  # the pod is gone


async def test_a_pod_frozen_by_an_earlier_agent_is_thawed_before_a_stop(
    api: KubeApi, kmock: Any, tmp_path: Path
) -> None:
    await create(api, gpu_manifest())
    state = pod_freezer_tree(tmp_path / "cgroup", "uid-train")
    state.write_text("FROZEN\n")  # this agent did not freeze it
    order: list[str] = []

    def react(request: Any) -> dict[str, Any]:
        order.append(state.read_text().strip())
        return {"kind": "Status", "status": "Success", "code": 200}

    kmock[f"delete /api/v1/namespaces/{NS}/pods/train"] << 200 << react
    rt = runtime(api, tmp_path, cgroup_root=tmp_path / "cgroup")
    await rt.stop(JOB, grace=0)
    assert order == ["THAWED"]  # thawed before the deletion's SIGTERM
