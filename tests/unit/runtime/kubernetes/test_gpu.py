"""GPU jobs on Kubernetes, the pure half (``specon.runtime.kubernetes.gpu``) and the pods'
freezer and PID map (``specon.runtime.kubernetes.freezer``) against cgroup trees laid out as a
kubelet lays them out (v1 and v2), with a fake ``/proc``. No GPU, no cluster."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import structlog

from specon.model import (
    GPU_ANY_PRODUCT_LABEL,
    GPU_MEMORY_LABEL,
    GPU_MEMORY_NEED_LABEL,
    GPU_PRODUCT_LABEL,
    Category,
    ContainerSnapshot,
    Resources,
    WorkerId,
    WorkerSnapshot,
)
from specon.policy.placement import fits
from specon.runtime.kubernetes import freezer as k8s_freezer
from specon.runtime.kubernetes.cgroup import PodCgroups
from specon.runtime.kubernetes.freezer import PodProcesses, host_pid_namespace, proc_pids
from specon.runtime.kubernetes.gpu import (
    allows_any_product,
    pin_product,
    pod_gpu_memory,
    product_conflict,
    product_pin,
)
from specon.runtime.kubernetes.pods import PodError, job_spec, node_capacity, restored_pod, template_of
from specon.runtime.kubernetes.restore import original_from_record, privilege_gains, record_of

H100 = "NVIDIA-H100-80GB-HBM3"
A100 = "NVIDIA-A100-SXM4-40GB"
H100_NODE = {GPU_PRODUCT_LABEL: H100, GPU_MEMORY_LABEL: "81559", "kubernetes.io/hostname": "gpu-1"}
UID = "0f6e7a2c-1b2d-4c5e-9f00-123456789abc"


def gpu_pod(
    gpus: int | None = 1,
    *,
    annotations: dict[str, str] | None = None,
    labels: dict[str, str] | None = None,
    selector: dict[str, str] | None = None,
    requests: bool = False,
    sidecar_gpus: int = 0,
) -> dict[str, Any]:
    """A training pod in namespace ml asking for ``gpus`` as the device plugin wants them:
    limits (with an equal request where ``requests``)."""
    limits: dict[str, Any] = {"cpu": "4", "memory": "16Gi"}
    if gpus is not None:
        limits["nvidia.com/gpu"] = gpus
    resources: dict[str, Any] = {"limits": limits}
    if requests:
        resources["requests"] = dict(limits)
    containers: list[dict[str, Any]] = [
        {
            "name": "train",
            "image": "trainer:1",
            "command": ["python", "train.py"],
            "resources": resources,
            "env": [{"name": "SPECON_CHECKPOINT_DIR", "value": "/data/jobs/j/checkpoints"}],
            "volumeMounts": [{"name": "data", "mountPath": "/data"}],
        }
    ]
    if sidecar_gpus:
        containers.append(
            {"name": "eval", "image": "e:1", "resources": {"limits": {"nvidia.com/gpu": sidecar_gpus}}}
        )
    spec: dict[str, Any] = {
        "nodeName": "gpu-1",
        "containers": containers,
        "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "specon-data"}}],
    }
    if selector is not None:
        spec["nodeSelector"] = selector
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "j",
            "namespace": "ml",
            "uid": UID,
            "labels": {"specon.io/managed": "true", **(labels or {})},
            "annotations": dict(annotations or {}),
        },
        "spec": spec,
        "status": {"phase": "Running"},
    }


# -- requests, memory, capacity -----------------------------------------------------------------
@pytest.mark.parametrize("requests", [False, True])
def test_gpu_limits_are_the_jobs_gpu_request_summed_over_containers(requests: bool) -> None:
    spec = job_spec(gpu_pod(2, requests=requests, sidecar_gpus=1))
    assert spec.requests == Resources(cpu=4.0, memory=16 * 2**30, gpu=3)
    assert job_spec(gpu_pod(None)).requests.gpu == 0


@pytest.mark.parametrize(
    ("raw", "expected"),
    [("40Gi", 40 * 2**30), ("80G", 80 * 10**9), ("42949672960", 42949672960), ("0", 0), (" 1Mi ", 2**20)],
)
def test_gpu_memory_annotation_is_bytes_or_a_quantity(raw: str, expected: int) -> None:
    pod = gpu_pod(annotations={GPU_MEMORY_NEED_LABEL: raw})
    assert pod_gpu_memory(pod) == expected
    assert job_spec(pod).gpu_memory == expected


@pytest.mark.parametrize("raw", ["lots", "-1Gi", "0.5", "100m", "40 GiB"])
def test_a_bad_gpu_memory_annotation_is_a_clear_refusal(raw: str) -> None:
    with pytest.raises(PodError, match=GPU_MEMORY_NEED_LABEL):
        job_spec(gpu_pod(annotations={GPU_MEMORY_NEED_LABEL: raw}))


def test_no_annotation_no_gpu_memory_need() -> None:
    assert job_spec(gpu_pod()).gpu_memory == 0


def test_a_nodes_allocatable_gpus_are_its_capacity() -> None:
    node = {
        "metadata": {"name": "gpu-1", "labels": H100_NODE},
        "status": {
            "capacity": {"cpu": "16", "memory": "128Gi", "nvidia.com/gpu": "8"},
            "allocatable": {"cpu": "15", "memory": "120Gi", "nvidia.com/gpu": "7"},
        },
    }
    assert node_capacity(node) == Resources(cpu=15.0, memory=120 * 2**30, gpu=7)


# -- the product a GPU job keeps to -----------------------------------------------------------
def test_a_gpu_job_keeps_to_its_nodes_product() -> None:
    pod = gpu_pod()
    assert product_pin(pod, H100_NODE) == (GPU_PRODUCT_LABEL, H100)
    pinned = pin_product(pod, H100_NODE)
    assert pinned["spec"]["nodeSelector"] == {GPU_PRODUCT_LABEL: H100}
    assert "nodeSelector" not in pod["spec"]  # a copy: the pod itself is untouched
    spec = job_spec(pinned)
    assert (GPU_PRODUCT_LABEL, H100) in spec.selector
    assert spec.template is not None and H100 in spec.template


@pytest.mark.parametrize(
    ("pod", "labels"),
    [
        (gpu_pod(None), H100_NODE),  # no GPU asked
        (gpu_pod(0), H100_NODE),
        (gpu_pod(), {"kubernetes.io/hostname": "gpu-1"}),  # no product label on its node
        (gpu_pod(annotations={GPU_ANY_PRODUCT_LABEL: "true"}), H100_NODE),
        (gpu_pod(labels={GPU_ANY_PRODUCT_LABEL: "True"}), H100_NODE),
        (gpu_pod(selector={GPU_PRODUCT_LABEL: A100}), H100_NODE),  # its own choice stands
    ],
)
def test_no_pin_where_none_is_wanted(pod: dict[str, Any], labels: dict[str, str]) -> None:
    assert product_pin(pod, labels) is None
    assert pin_product(pod, labels) == pod


def test_a_pin_joins_the_pods_own_selector() -> None:
    pinned = pin_product(gpu_pod(selector={"zone": "a"}), H100_NODE)
    assert pinned["spec"]["nodeSelector"] == {"zone": "a", GPU_PRODUCT_LABEL: H100}
    assert job_spec(pinned).selector == ((GPU_PRODUCT_LABEL, H100), ("zone", "a"))


def test_any_product_needs_a_true_value() -> None:
    assert allows_any_product(gpu_pod(annotations={GPU_ANY_PRODUCT_LABEL: "yes"}))
    assert not allows_any_product(gpu_pod(annotations={GPU_ANY_PRODUCT_LABEL: "false"}))
    assert not allows_any_product(gpu_pod())


def test_the_restore_record_and_the_copy_keep_the_limits_and_gain_the_pin() -> None:
    pod = gpu_pod(2, annotations={GPU_MEMORY_NEED_LABEL: "40Gi"})
    record = record_of(pin_product(pod, H100_NODE))
    original = original_from_record(record, job_spec(pod).id)
    copy = restored_pod(
        template_of(original),
        job=job_spec(pod).id,
        node="gpu-2",
        gen=2,
        restored_from="j",
        restore_checkpoint=None,
    )
    assert copy["spec"]["containers"][0]["resources"] == pod["spec"]["containers"][0]["resources"]
    assert copy["spec"]["nodeSelector"] == {GPU_PRODUCT_LABEL: H100}
    assert privilege_gains(pod, copy) == []  # a selector is a constraint, not a privilege
    spec = job_spec(copy)
    assert (spec.requests.gpu, spec.gpu_memory) == (2, 40 * 2**30)
    assert product_conflict(copy, H100_NODE) is None
    assert product_conflict(copy, {}) is not None
    why = product_conflict(copy, {GPU_PRODUCT_LABEL: A100})
    assert why is not None and H100 in why and A100 in why


def worker(product: str, gpus: int, mib: int = 81559) -> WorkerSnapshot:
    labels = ((GPU_MEMORY_LABEL, str(mib)), (GPU_PRODUCT_LABEL, product))
    return WorkerSnapshot(id=WorkerId("w"), capacity=Resources(cpu=16, memory=2**40, gpu=gpus), labels=labels)


def test_the_managers_placement_honours_the_pinned_spec() -> None:
    """What the agent reports (the pinned spec) is what Algorithm 2's feasibility rule checks."""
    spec = job_spec(pin_product(gpu_pod(2, annotations={GPU_MEMORY_NEED_LABEL: "60Gi"}), H100_NODE))
    job = ContainerSnapshot(
        id=spec.id,
        worker=WorkerId("src"),
        category=Category.CONVERGED,
        requests=spec.requests,
        selector=spec.selector,
        gpu_memory=spec.gpu_memory,
    )
    free = Resources()
    assert fits(job, worker(H100, 2), free)
    assert not fits(job, worker(A100, 8), free)  # another product
    assert not fits(job, worker(H100, 1), free)  # too few GPUs
    assert not fits(job, worker(H100, 2, mib=40960), free)  # too little memory per device
    anywhere = job_spec(gpu_pod(2, annotations={GPU_ANY_PRODUCT_LABEL: "true"}))
    loose = ContainerSnapshot(
        id=anywhere.id, worker=WorkerId("src"), category=Category.CONVERGED, requests=anywhere.requests
    )
    assert fits(loose, worker(A100, 8), free)


# -- the freezer --------------------------------------------------------------------------------
def v1_tree(tmp_path: Path, rel: str = f"kubepods/pod{UID}") -> Path:
    root = tmp_path / "cgroup"
    for hierarchy in ("cpu", "cpuacct", "freezer"):
        (root / hierarchy / rel / "ctr1").mkdir(parents=True)
        (root / hierarchy / "cgroup.procs").write_text("")
    (root / "cpu" / "cpu.shares").write_text("1024\n")
    (root / "freezer" / rel / "freezer.state").write_text("THAWED\n")
    return root


def v2_tree(tmp_path: Path) -> tuple[Path, Path]:
    root = tmp_path / "cgroup"
    # The pod is Guaranteed (limits only: requests default to them): right below kubepods.
    group = root / "kubepods.slice" / f"kubepods-pod{UID.replace('-', '_')}.slice"
    (group / "cri-containerd-abc.scope").mkdir(parents=True)
    (root / "cgroup.controllers").write_text("cpu io memory pids\n")
    (root / "cgroup.procs").write_text("")
    (group / "cgroup.freeze").write_text("0\n")
    return root, group


JOB = job_spec(gpu_pod()).id


def test_v1_freeze_and_thaw_write_the_pods_freezer_state(tmp_path: Path) -> None:
    root = v1_tree(tmp_path)
    state = root / "freezer" / "kubepods" / f"pod{UID}" / "freezer.state"
    procs = PodProcesses(PodCgroups(root), tmp_path / "proc")
    pod = gpu_pod()
    assert procs.set_frozen(JOB, pod, True) and state.read_text() == "FROZEN"
    assert procs.frozen == {JOB} and procs.is_frozen(pod)
    assert procs.set_frozen(JOB, pod, False) and state.read_text() == "THAWED"
    assert procs.frozen == set() and not procs.is_frozen(pod)


def test_v2_freeze_waits_for_cgroup_events(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root, group = v2_tree(tmp_path)
    procs = PodProcesses(PodCgroups(root), tmp_path / "proc")
    pod = gpu_pod()
    (group / "cgroup.events").write_text("populated 1\nfrozen 1\n")  # as the kernel reports it
    assert procs.set_frozen(JOB, pod, True) and (group / "cgroup.freeze").read_text() == "1"
    (group / "cgroup.events").write_text("populated 1\nfrozen 0\n")
    assert procs.set_frozen(JOB, pod, False) and (group / "cgroup.freeze").read_text() == "0"
    # A freeze that never completes (a task stuck in the kernel) is undone and refused.
    monkeypatch.setattr(k8s_freezer, "FREEZE_WAIT_S", 0.05)
    with structlog.testing.capture_logs() as logs:
        assert not procs.set_frozen(JOB, pod, True)
    assert (group / "cgroup.freeze").read_text() == "0" and procs.frozen == set()
    assert [e["event"] for e in logs] == ["specon.k8s.freeze_unavailable"]
    assert "did not complete" in logs[0]["error"]


def test_without_the_nodes_cgroups_freeze_is_refused_once_and_thaw_is_a_no_op(tmp_path: Path) -> None:
    procs = PodProcesses(PodCgroups(tmp_path / "absent"), tmp_path / "proc")
    with structlog.testing.capture_logs() as logs:
        assert not procs.set_frozen(JOB, gpu_pod(), True)
        assert not procs.set_frozen(JOB, gpu_pod(), True)
    assert len(logs) == 1 and "no cgroup freezer" in logs[0]["error"]
    assert procs.set_frozen(JOB, gpu_pod(), False)  # nothing here was frozen


def test_a_pod_without_a_group_or_gone_is_refused_or_already_thawed(tmp_path: Path) -> None:
    root = v1_tree(tmp_path)
    procs = PodProcesses(PodCgroups(root), tmp_path / "proc")
    stranger = gpu_pod()
    stranger["metadata"]["uid"] = "11111111-2222-3333-4444-555555555555"
    assert not procs.set_frozen(JOB, stranger, True)
    assert not procs.set_frozen(JOB, None, True)
    assert procs.set_frozen(JOB, None, False)


# -- PIDs ---------------------------------------------------------------------------------------
def fake_proc(tmp_path: Path, nspid: str, cgroups: dict[int, str]) -> Path:
    proc = tmp_path / "proc"
    (proc / "self").mkdir(parents=True)
    (proc / "self" / "status").write_text(f"Name:\tagent\nPid:\t7\nNSpid:\t{nspid}\n")
    for pid, text in cgroups.items():
        (proc / str(pid)).mkdir()
        (proc / str(pid) / "cgroup").write_text(text)
    return proc


def test_host_pid_namespace_from_nspid(tmp_path: Path) -> None:
    assert host_pid_namespace(fake_proc(tmp_path / "a", "4242", {})) is True
    assert host_pid_namespace(fake_proc(tmp_path / "b", "4242\t7", {})) is False
    (tmp_path / "c" / "self").mkdir(parents=True)
    (tmp_path / "c" / "self" / "status").write_text("Name:\told\n")
    assert host_pid_namespace(tmp_path / "c") is None


def test_pids_come_from_the_pods_groups_recursively(tmp_path: Path) -> None:
    root = v1_tree(tmp_path)
    pod_dir = root / "cpu" / "kubepods" / f"pod{UID}"
    (pod_dir / "cgroup.procs").write_text("")  # the pod's own group holds nobody
    (pod_dir / "ctr1" / "cgroup.procs").write_text("101\n102\n0\n")  # 0: outside our namespace
    (pod_dir / "ctr1" / "sub").mkdir()
    (pod_dir / "ctr1" / "sub" / "cgroup.procs").write_text("103\n")
    procs = PodProcesses(PodCgroups(root), fake_proc(tmp_path, "7", {}))
    assert procs.pids([(JOB, gpu_pod())]) == {JOB: frozenset({101, 102, 103})}


def test_without_a_cgroup_tree_pids_come_from_each_processs_cgroup_file(tmp_path: Path) -> None:
    underscored = UID.replace("-", "_")
    proc = fake_proc(
        tmp_path,
        "7",
        {
            11: f"12:pids:/kubepods/burstable/pod{UID}/abc\n1:cpu:/kubepods/burstable/pod{UID}/abc\n",
            12: f"0::/kubepods.slice/kubepods-pod{underscored}.slice/cri-containerd-0abc.scope\n",
            13: "0::/system.slice/kubelet.service\n",
            14: "0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-podffff.slice/x\n",
        },
    )
    assert proc_pids(proc, {UID: JOB}) == {JOB: {11, 12}}
    procs = PodProcesses(PodCgroups(tmp_path / "absent"), proc)
    assert procs.pids([(JOB, gpu_pod())]) == {JOB: frozenset({11, 12})}


def test_outside_the_host_pid_namespace_no_pids_logged_once(tmp_path: Path) -> None:
    root = v1_tree(tmp_path)
    (root / "cpu" / "kubepods" / f"pod{UID}" / "ctr1" / "cgroup.procs").write_text("5\n")
    procs = PodProcesses(PodCgroups(root), fake_proc(tmp_path, "900\t5", {}))
    with structlog.testing.capture_logs() as logs:
        assert procs.pids([(JOB, gpu_pod())]) == {}
        assert procs.pids([(JOB, gpu_pod())]) == {}
    assert [e["event"] for e in logs] == ["specon.k8s.pids_unavailable"]
    assert "hostPID" in logs[0]["error"]
