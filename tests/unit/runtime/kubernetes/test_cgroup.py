"""A pod's cgroup on its node (``specon.runtime.kubernetes.cgroup``), against temporary trees laid
out as a kubelet lays out cgroup v1 and v2, with either cgroup driver."""

from __future__ import annotations

from pathlib import Path, PurePosixPath
from typing import Any

import pytest
import structlog

from specon.model import ContainerId
from specon.runtime.kubernetes import cgroup as k8s_cgroup
from specon.runtime.kubernetes.cgroup import (
    PodCgroups,
    find_kubepods,
    pod_cgroup_names,
    pod_cpu_limit,
    qos_class,
)

UID = "0f6e7a2c-1b2d-4c5e-9f00-123456789abc"
JOB = ContainerId("default.train")


def pod(*containers: dict[str, Any], uid: str = UID, qos: str | None = None, **meta: Any) -> dict[str, Any]:
    out: dict[str, Any] = {
        "metadata": {"name": "train", "namespace": "default", "uid": uid, **meta},
        "spec": {"containers": list(containers) or [{"name": "c"}]},
    }
    if qos is not None:
        out["status"] = {"qosClass": qos}
    return out


def res(requests: dict[str, str] | None = None, limits: dict[str, str] | None = None) -> dict[str, Any]:
    return {"name": "c", "resources": {"requests": requests or {}, "limits": limits or {}}}


# -- pure rules ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("containers", "expected"),
    [
        ([{"name": "c"}], "BestEffort"),
        ([res(limits={"cpu": "1", "memory": "1Gi"})], "Guaranteed"),  # requests default to limits
        ([res({"cpu": "1", "memory": "1Gi"}, {"cpu": "1", "memory": "1Gi"})], "Guaranteed"),
        ([res({"cpu": "500m"}, {"cpu": "1", "memory": "1Gi"})], "Burstable"),
        ([res({"cpu": "1"})], "Burstable"),
        ([res(limits={"cpu": "1", "memory": "1Gi"}), {"name": "sidecar"}], "Burstable"),
    ],
)
def test_qos_class_follows_the_api_servers_rule(containers: list[dict[str, Any]], expected: str) -> None:
    assert qos_class(pod(*containers)) == expected


def test_qos_class_prefers_what_the_api_server_recorded() -> None:
    assert qos_class(pod(res(limits={"cpu": "1", "memory": "1"}), qos="Burstable")) == "Burstable"
    assert qos_class(pod(qos="nonsense")) == "BestEffort"


def test_pod_cpu_limit_sums_the_containers_limits() -> None:
    assert pod_cpu_limit(pod(res(limits={"cpu": "500m"}), res(limits={"cpu": "2"}))) == 2.5
    assert pod_cpu_limit(pod(res(limits={"cpu": "1"}), {"name": "unlimited"})) is None
    assert pod_cpu_limit(pod(res(limits={"cpu": "lots"}))) is None


@pytest.mark.parametrize(
    ("qos", "cgroupfs", "systemd"),
    [
        ("Guaranteed", f"pod{UID}", "kubepods-pod0f6e7a2c_1b2d_4c5e_9f00_123456789abc.slice"),
        (
            "Burstable",
            f"burstable/pod{UID}",
            "kubepods-burstable.slice/kubepods-burstable-pod0f6e7a2c_1b2d_4c5e_9f00_123456789abc.slice",
        ),
        (
            "BestEffort",
            f"besteffort/pod{UID}",
            "kubepods-besteffort.slice/kubepods-besteffort-pod0f6e7a2c_1b2d_4c5e_9f00_123456789abc.slice",
        ),
    ],
)
def test_pod_cgroup_names_for_both_drivers(qos: str, cgroupfs: str, systemd: str) -> None:
    assert pod_cgroup_names(UID, qos) == (PurePosixPath(cgroupfs), PurePosixPath(systemd))


@pytest.mark.parametrize("uid", ["", "../x", "a/b", "."])
def test_pod_cgroup_names_refuse_a_uid_that_is_not_one_path_component(uid: str) -> None:
    with pytest.raises(ValueError, match="bad pod uid"):
        pod_cgroup_names(uid, "Burstable")


# -- the node's cgroup tree ---------------------------------------------------------------------
def v1_node(tmp_path: Path) -> Path:
    """/sys/fs/cgroup of a v1 node with separate cpu and cpuacct hierarchies."""
    root = tmp_path / "cgroup"
    for hierarchy in ("cpu", "cpuacct"):
        (root / hierarchy).mkdir(parents=True)
    (root / "cpu" / "cpu.shares").write_text("1024\n")
    return root


def pod_group(root: Path, hierarchy: str, rel: str) -> Path:
    d = root / hierarchy / rel
    d.mkdir(parents=True)
    return d


def test_find_kubepods_finds_every_kubelets_root_without_descending(tmp_path: Path) -> None:
    top = tmp_path / "cpu"
    for rel in (
        "kubepods/burstable/podx",
        "process_api/abc/node0/kubepods/besteffort",
        "process_api/abc/node1/kubepods.slice",
        "a/b/c/d/e/f/kubepods",  # deeper than any kubelet root we look for
        "user.slice",
    ):
        (top / rel).mkdir(parents=True)
    found = find_kubepods(top)
    assert [p.relative_to(top).as_posix() for p in found] == [
        "kubepods",
        "process_api/abc/node0/kubepods",
        "process_api/abc/node1/kubepods.slice",
    ]


def test_v1_weight_goes_to_the_pods_shares_under_a_nested_cgroup_root(tmp_path: Path) -> None:
    root = v1_node(tmp_path)
    rel = f"process_api/abc/node1/kubepods/burstable/pod{UID}"
    group = pod_group(root, "cpu", rel)
    (root / "cpu" / "process_api/abc/node0/kubepods").mkdir(parents=True)  # another kubelet's
    cg = PodCgroups(root)
    assert cg.unavailable() is None
    assert cg.set_weight(JOB, pod(res({"cpu": "1"})), 10_000)
    assert (group / "cpu.shares").read_text() == "102400"
    assert cg.locate(pod(res({"cpu": "1"}))) == PurePosixPath(rel)
    acct = pod_group(root, "cpuacct", rel)
    (acct / "cpuacct.usage").write_text("1500000000\n")
    assert cg.cpu_seconds([(JOB, pod(res({"cpu": "1"})))]) == {JOB: 1.5}


def test_v1_systemd_driver_guaranteed_pod(tmp_path: Path) -> None:
    root = v1_node(tmp_path)
    group = pod_group(root, "cpu", "kubepods.slice/kubepods-pod0f6e7a2c_1b2d_4c5e_9f00_123456789abc.slice")
    assert PodCgroups(root).set_weight(JOB, pod(qos="Guaranteed"), 1)
    assert (group / "cpu.shares").read_text() == "10"


def test_v2_weight_is_written_as_is_and_cpu_seconds_come_from_cpu_stat(tmp_path: Path) -> None:
    root = tmp_path / "cgroup"
    root.mkdir()
    (root / "cgroup.controllers").write_text("cpuset cpu io memory\n")  # the root has no cpu.weight
    group = root / "kubepods" / "besteffort" / f"pod{UID}"
    group.mkdir(parents=True)
    (group / "cpu.stat").write_text("usage_usec 2500000\nuser_usec 2000000\n")
    cg = PodCgroups(root)
    assert cg.set_weight(JOB, pod(), 250)
    assert (group / "cpu.weight").read_text() == "250"
    assert cg.cpu_seconds([(JOB, pod())]) == {JOB: 2.5}


def test_a_pod_created_after_the_last_search_is_found_by_a_later_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = v1_node(tmp_path)
    cg = PodCgroups(root)
    assert not cg.set_weight(JOB, pod(qos="Burstable"), 100)  # no kubelet root yet
    group = pod_group(root, "cpu", f"kubepods/burstable/pod{UID}")
    assert not cg.set_weight(JOB, pod(qos="Burstable"), 100)  # searched a moment ago
    monkeypatch.setattr(k8s_cgroup, "RESEARCH_S", 0.0)
    assert cg.set_weight(JOB, pod(qos="Burstable"), 100)
    assert (group / "cpu.shares").read_text() == "1024"


def test_a_v2_node_without_the_cpu_controller_refuses(tmp_path: Path) -> None:
    (tmp_path / "cgroup.controllers").write_text("memory pids\n")
    assert "no cgroup CPU controller" in (PodCgroups(tmp_path).unavailable() or "")


def test_refusals_are_false_and_logged_once(tmp_path: Path) -> None:
    nothing = PodCgroups(tmp_path / "not-mounted")
    with structlog.testing.capture_logs() as logs:
        assert not nothing.set_weight(JOB, pod(), 100)
        assert not nothing.set_weight(ContainerId("default.other"), pod(uid="u2"), 100)
    assert len(logs) == 1 and "mount the node's /sys/fs/cgroup" in logs[0]["error"]
    assert logs[0]["event"] == "specon.k8s.cpu_weight_unavailable"
    cg = PodCgroups(v1_node(tmp_path))
    with structlog.testing.capture_logs() as logs:
        assert not cg.set_weight(JOB, None, 100)  # no live pod of the job here
        assert not cg.set_weight(JOB, pod(), 100)  # no group for it under a kubepods root
        assert not cg.set_weight(JOB, pod(), 100)
    assert [("no live pod" in e["error"], "no cgroup of pod" in e["error"]) for e in logs] == [
        (True, False),
        (False, True),
    ]
    assert cg.cpu_seconds([(JOB, pod())]) == {}
