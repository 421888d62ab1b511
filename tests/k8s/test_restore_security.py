"""A restore on Kubernetes runs the job's pod as the API server held it, in the job's own
namespace, with no privilege the original lacked; jobs are (namespace, job). Each attack of
issue 8 on these, against a real kube-apiserver with the kubelet stand-in running the pods
as local processes (a forged pod that ran would leave its mark on this host)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from specon.model import ContainerId
from specon.runtime.base import JobSpec, StartFailed
from specon.runtime.kubernetes.backend import KubeApi, KubeError, KubernetesRuntime
from specon.runtime.kubernetes.pods import LABEL_JOB, template_of
from specon.runtime.kubernetes.restore import record_name, record_of
from tests.k8s.cluster import KubeCluster
from tests.k8s.kubelet import FakeKubelet
from tests.k8s.test_runtime_kubernetes import running, shared_volume, trained, training_pod, until

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(180)]


@pytest.fixture
def admin(kube_cluster: KubeCluster) -> KubeApi:
    return KubeApi(kube_cluster.api_client())


@pytest.fixture
def other(kube_cluster: KubeCluster, admin: KubeApi, kube_namespace: str, tmp_path: Path) -> Iterator[str]:
    """A second namespace on the same shared volume."""
    with kube_cluster.temporary_namespace("other") as ns:
        shared_volume(admin, ns, tmp_path / "shared")
        yield ns
        admin.request("DELETE", f"/api/v1/persistentvolumes/specon-data-{ns}")


@pytest.fixture
async def nodes(
    kube_cluster: KubeCluster, admin: KubeApi, kube_namespace: str, fake_kubelet: FakeKubelet, tmp_path: Path
) -> AsyncIterator[dict[str, KubernetesRuntime]]:
    volume = tmp_path / "shared"
    shared_volume(admin, kube_namespace, volume)
    made = {
        n: KubernetesRuntime(kube_cluster.api_client(), n, volume_root=volume, kill_slack=5.0)
        for n in ("node-1", "node-2")
    }
    yield made
    for rt in made.values():
        rt.close()
    admin.request("DELETE", f"/api/v1/persistentvolumes/specon-data-{kube_namespace}")


async def post(api: KubeApi, path: str, body: dict[str, Any]) -> Any:
    return await asyncio.to_thread(api.request, "POST", path, body=body)


async def get(api: KubeApi, path: str) -> Any:
    return await asyncio.to_thread(api.request, "GET", path)


async def saved_job(admin: KubeApi, ns: str, rt: KubernetesRuntime, volume: Path, job: str = "j1") -> Path:
    """A training pod of ``job`` on node-1, run past a checkpoint and saved; its checkpoint."""
    await post(admin, f"/api/v1/namespaces/{ns}/pods", training_pod("train", "node-1", job=job, steps=4000))
    await until(lambda: running(rt, job), f"{job} running on node-1")
    await until(lambda: len(trained(volume, job)) >= 30, f"{job} past a checkpoint")
    res = await rt.save(ContainerId(f"{ns}.{job}"), grace=10)
    assert res.checkpoint is not None
    return res.checkpoint


def evil_template(namespace: str, marker: Path) -> str:
    """What a holder of one agent's manager token could put in a save result: a privileged,
    host-networked pod with the host's root mounted, another ServiceAccount, in another
    namespace, running a command of its choice."""
    pod = training_pod("pwn", "node-2", job="j1")
    pod["metadata"]["namespace"] = namespace
    spec = pod["spec"]
    spec.update(hostNetwork=True, hostPID=True, serviceAccountName="admin")
    spec["volumes"].append({"name": "host", "hostPath": {"path": "/"}})
    c = spec["containers"][0]
    c["command"] = ["python", "-c", f"open({str(marker)!r}, 'w').write('pwned')"]
    c["securityContext"] = {"privileged": True}
    c["volumeMounts"].append({"name": "host", "mountPath": "/host"})
    return json.dumps(template_of(pod))


async def test_a_forged_save_result_chooses_neither_what_runs_nor_where(
    admin: KubeApi, kube_namespace: str, other: str, nodes: dict[str, KubernetesRuntime], tmp_path: Path
) -> None:
    ns, volume, marker = kube_namespace, tmp_path / "shared", tmp_path / "pwned"
    checkpoint = await saved_job(admin, ns, nodes["node-1"], volume)
    job = ContainerId(f"{ns}.j1")
    # The agent asks its runtime for the job's spec (not the command's): the trusted one.
    trusted = await asyncio.to_thread(nodes["node-2"].job_spec, job)
    assert trusted is not None and trusted.id == job and trusted.template is not None
    original = json.loads(trusted.template)
    assert original["metadata"]["namespace"] == ns and "hostNetwork" not in original["spec"]
    # Even handed the forged spec, start uses its id only.
    forged = JobSpec(id=job, command=("python", "-c", "pwn"), template=evil_template(other, marker))
    info = await nodes["node-2"].start(forged, checkpoint=checkpoint)
    assert info.handle == f"{ns}/train-g2"
    pod = await get(admin, f"/api/v1/namespaces/{ns}/pods/train-g2")
    spec = pod["spec"]
    assert spec["containers"][0]["command"] == original["spec"]["containers"][0]["command"]
    assert (
        not spec.get("hostNetwork")
        and not spec.get("hostPID")
        and "securityContext" not in spec["containers"][0]
    )
    assert [v["name"] for v in spec["volumes"]] == ["data"] and spec.get("serviceAccountName") in (
        None,
        "default",
    )
    assert (await get(admin, f"/api/v1/namespaces/{other}/pods"))["items"] == []
    await until(lambda: max(trained(volume, "j1"), default=0) > 35, "the real job to train on node-2")
    assert not marker.exists()


async def test_a_record_of_another_job_is_refused_and_nothing_is_created(
    admin: KubeApi, kube_namespace: str, nodes: dict[str, KubernetesRuntime]
) -> None:
    """A record planted under this job's name that describes another job (say, one with a
    hostPath) is not this job's recipe."""
    ns = kube_namespace
    impostor = training_pod("impostor", "node-1", job="j2")
    impostor["metadata"]["namespace"] = ns
    impostor["spec"]["volumes"].append({"name": "host", "hostPath": {"path": "/"}})
    record = record_of(impostor)
    record["metadata"]["name"] = record_name(ContainerId(f"{ns}.j1"))
    await post(admin, f"/api/v1/namespaces/{ns}/podtemplates", record)
    with pytest.raises(StartFailed, match=f"describes job {ns}.j2, not {ns}.j1"):
        await nodes["node-2"].start(JobSpec(id=ContainerId(f"{ns}.j1"), command=("x",)))
    assert await asyncio.to_thread(nodes["node-2"].job_spec, ContainerId(f"{ns}.j1")) is None
    assert (await get(admin, f"/api/v1/namespaces/{ns}/pods"))["items"] == []


async def test_a_job_without_a_pod_or_record_is_not_started_from_its_spec(
    admin: KubeApi, kube_namespace: str, nodes: dict[str, KubernetesRuntime], tmp_path: Path
) -> None:
    """No trusted original anywhere (never saved, or its record deleted): whatever spec comes
    with the command, nothing starts; the volume's files are no recipe either."""
    ns, marker = kube_namespace, tmp_path / "pwned"
    (tmp_path / "shared" / "jobs" / "j9").mkdir(parents=True)
    (tmp_path / "shared" / "jobs" / "j9" / "spec.json").write_text(
        json.dumps({"id": f"{ns}.j9", "command": ["x"], "template": evil_template(ns, marker)})
    )
    forged = JobSpec(id=ContainerId(f"{ns}.j9"), command=("x",), template=evil_template(ns, marker))
    with pytest.raises(StartFailed, match="nothing trusted to restore from"):
        await nodes["node-2"].start(forged)
    assert await asyncio.to_thread(nodes["node-2"].job_spec, ContainerId(f"{ns}.j9")) is None
    assert (await get(admin, f"/api/v1/namespaces/{ns}/pods"))["items"] == []


async def test_one_job_name_in_two_namespaces_is_two_containers(
    admin: KubeApi, kube_namespace: str, other: str, nodes: dict[str, KubernetesRuntime], tmp_path: Path
) -> None:
    volume = tmp_path / "shared"
    for ns in (kube_namespace, other):
        pod = training_pod("train", "node-1", job="same", steps=4000)
        for e in pod["spec"]["containers"][0]["env"]:  # its own files: jobs/<namespace>.<job>/
            e["value"] = e["value"].replace("/jobs/same/", f"/jobs/{ns}.same/")
        await post(admin, f"/api/v1/namespaces/{ns}/pods", pod)
    a, b = ContainerId(f"{kube_namespace}.same"), ContainerId(f"{other}.same")

    async def both() -> list[str] | None:
        ids = sorted(c.id for c in await nodes["node-1"].list_containers() if c.alive)
        return ids if len(ids) == 2 else None

    assert await until(both, "both jobs listed") == sorted([a, b])
    await until((volume / "jobs" / f"{other}.same" / "checkpoints").exists, "a checkpoint of b")
    res = await nodes["node-1"].save(a, grace=10)
    assert await running(nodes["node-1"], b) is not None  # the namesake in the other namespace runs on
    started = await nodes["node-2"].start(JobSpec(id=a, command=("x",)), checkpoint=res.checkpoint)
    assert started.id == a and started.handle == f"{kube_namespace}/train-g2"
    names = {ns: [p["metadata"]["name"] for p in (await get(admin, f"/api/v1/namespaces/{ns}/pods"))["items"]]
             for ns in (kube_namespace, other)}  # fmt: skip
    assert names == {kube_namespace: ["train-g2"], other: ["train"]}
    # Each job has its own record, in its own namespace.
    with pytest.raises(KubeError) as err:
        await get(admin, f"/api/v1/namespaces/{other}/podtemplates/{record_name(a)}")
    assert err.value.status == 404
    rec = await get(admin, f"/api/v1/namespaces/{kube_namespace}/podtemplates/{record_name(a)}")
    assert rec["template"]["metadata"]["labels"][LABEL_JOB] == "same"


# What Kubernetes' stock `admin` role aggregates (with `edit` and `view`): the roles a training
# team usually holds in its namespace. (No controller-manager runs here to aggregate them
# into `admin` itself, so the test binds the parts.)
TEAM_ROLES = ("system:aggregate-to-admin", "system:aggregate-to-edit", "system:aggregate-to-view")


async def test_a_namespace_admin_cannot_plant_a_restore_record(
    kube_rbac_cluster: KubeCluster, kube_rbac_namespace: str
) -> None:
    """Records are PodTemplates, which the stock namespace roles do not grant (they grant
    ConfigMaps and pods): a team member cannot forge the recipe the agent restores from."""
    ns = kube_rbac_namespace
    admin = KubeApi(kube_rbac_cluster.api_client())
    sa = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "team"}}
    admin.request("POST", f"/api/v1/namespaces/{ns}/serviceaccounts", body=sa)
    for role in TEAM_ROLES:
        binding = {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": role.replace(":", "-")},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
            "subjects": [{"kind": "ServiceAccount", "name": "team", "namespace": ns}],
        }
        admin.request(
            "POST", f"/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/rolebindings", body=binding
        )
    team = KubeApi(kube_rbac_cluster.api_client(kube_rbac_cluster.service_account_token(ns, "team")))
    pod = training_pod("train", "node-1", job="j1")
    pod["metadata"]["namespace"] = ns
    dry = {"dryRun": "All"}

    def may(kind: str, body: dict[str, Any]) -> bool:
        try:
            team.request("POST", f"/api/v1/namespaces/{ns}/{kind}", body=body, query=dry)
        except KubeError as exc:
            assert exc.status == 403, exc
            return False
        return True

    cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cm"}}
    await until(lambda: may("configmaps", cm), "the team's bindings to take effect")
    assert may("pods", pod)  # a team may create its pods ...
    assert not may("podtemplates", record_of(pod))  # ... but not a restore record
