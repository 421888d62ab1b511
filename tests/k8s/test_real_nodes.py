"""The Kubernetes end-to-end scenarios on real nodes: two kubelets v1.20.2, each with its own
containerd, running the pods in containers of the offline training image (``nodes.py``).

The scenario code is the stand-in tests' own (``test_e2e_kubernetes.py``,
``test_runtime_kubernetes.py``); here it runs through real kubelets: eviction, SIGTERM and the
grace period, pod teardown and creation are the kubelet's. One pair of nodes serves the session.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from specon.runtime.base import cpu_shares
from specon.runtime.kubernetes.backend import KubeApi, KubeError, KubernetesRuntime
from tests.k8s.cluster import KubeCluster
from tests.k8s.nodes import RealNodes, on_real_node
from tests.k8s.test_e2e_kubernetes import (
    POLICY,
    Deployment,
    both_agents,
    converged_pod_moves,
    deployed,
    manager_restart_recovers,
)
from tests.k8s.test_runtime_kubernetes import (
    create,
    deaf_job_is_killed_and_resumes,
    disruption_budget_blocks_the_save,
    node_runtimes,
    running,
    shared_volume,
    training_pod,
    until,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(240)]

AGENT_MANIFEST = Path(__file__).resolve().parents[2] / "manifests" / "base" / "agent.yaml"
SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"


def daemonset_agent_pod(d: Deployment, node: str, host: str) -> dict[str, Any]:
    """The pod the DaemonSet of manifests/base/agent.yaml would create on ``node``: its
    container, args, env, securityContext, resources and volumes (the projected token for
    the manager, the policy ConfigMap, the shared claim, /tmp) as written, in the offline
    image with the host binds (nodes.on_real_node). What this cluster lacks is filled in:
    - no pod network: ``hostNetwork`` (on_real_node), the agent listening on ``host``
      (loopback) instead of 0.0.0.0, no probes (the kubelet would probe the node's
      non-loopback address), and the manager's URL instead of its Service's DNS name;
    - no ServiceAccount admission plugin nor root-CA publisher: the volume a 1.21+ API server
      injects for in-cluster access (a bound token, ``kube-root-ca.crt``, the namespace), and
      ``KUBERNETES_SERVICE_HOST/PORT`` naming the API server on 127.0.0.1 (no kube-proxy).
    """
    docs = yaml.safe_load_all(AGENT_MANIFEST.read_text())
    ds = next(doc for doc in docs if doc and doc.get("kind") == "DaemonSet")
    template = copy.deepcopy(ds["spec"]["template"])
    spec = template["spec"]
    spec["nodeName"] = node  # the DaemonSet controller's one decision
    c = spec["containers"][0]
    # Port 0: nothing calls an agent, and a port picked here could be taken before it binds.
    replace = {"--manager": d.url, "--listen": f"{host}:0"}
    c["args"] = [
        f"{a.partition('=')[0]}={replace[a.partition('=')[0]]}" if a.partition("=")[0] in replace else a
        for a in c["args"]
    ]
    for key in ("readinessProbe", "livenessProbe", "ports"):
        c.pop(key, None)
    c["env"] = [
        *c.get("env", []),
        {"name": "KUBERNETES_SERVICE_HOST", "value": "127.0.0.1"},
        {"name": "KUBERNETES_SERVICE_PORT", "value": str(d.cluster.port)},
    ]
    c["volumeMounts"].append({"name": "kube-api-access", "mountPath": SA_DIR, "readOnly": True})
    spec["volumes"].append(
        {
            "name": "kube-api-access",
            "projected": {
                "sources": [
                    {"serviceAccountToken": {"path": "token", "expirationSeconds": 3600}},
                    {
                        "configMap": {
                            "name": "kube-root-ca.crt",
                            "items": [{"key": "ca.crt", "path": "ca.crt"}],
                        }
                    },
                    {
                        "downwardAPI": {
                            "items": [{"path": "namespace", "fieldRef": {"fieldPath": "metadata.namespace"}}]
                        }
                    },
                ]
            },
        }
    )
    admin = KubeApi(d.cluster.api_client())
    for name, data in (
        ("kube-root-ca.crt", {"ca.crt": d.cluster.ca_file.read_text()}),
        ("specon-policy", {"policy.yaml": POLICY}),
    ):
        cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": data}
        with contextlib.suppress(KubeError):  # made for the other node's pod
            admin.request("POST", f"/api/v1/namespaces/{d.namespace}/configmaps", body=cm)
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"specon-agent-{node}", "labels": template["metadata"]["labels"]},
        "spec": spec,
    }
    return on_real_node(pod)


@pytest.fixture
def real_admin(real_cluster: KubeCluster) -> KubeApi:
    return KubeApi(real_cluster.api_client())


@pytest.fixture
def real_volume(real_admin: KubeApi, real_namespace: str, tmp_path: Path) -> Iterator[Path]:
    root = tmp_path / "shared"
    shared_volume(real_admin, real_namespace, root)
    yield root
    real_admin.request("DELETE", f"/api/v1/persistentvolumes/specon-data-{real_namespace}")


@pytest.fixture
def real_runtimes(
    real_cluster: KubeCluster, real_namespace: str, real_volume: Path, real_nodes: RealNodes
) -> Iterator[dict[str, KubernetesRuntime]]:
    # A bound on a hung kubelet, not a measurement: a 1.20 kubelet confirms a deletion (the API
    # object goes) only once the pod's containers, volumes and cgroups are gone, and then at its
    # status manager's next 10 s batch: ~13 s after the container exited on a quiet machine,
    # 56 s for a checkpointed pod and over 31 s for a killed deaf one (grace 1 s) in full runs.
    with node_runtimes(real_cluster, real_namespace, real_volume, kill_slack=120.0) as made:
        yield made


@pytest.fixture
async def real_deployment(
    real_cluster: KubeCluster, real_namespace: str, real_nodes: RealNodes, tmp_path: Path
) -> AsyncIterator[Deployment]:
    async with deployed(real_cluster, real_namespace, tmp_path, adapt=on_real_node) as d:
        yield d


async def test_a_converged_pod_moves_between_real_nodes_and_finishes_exactly(
    real_deployment: Deployment,
) -> None:
    # The job is held until its migration is done (converged_pod_moves): a loaded machine
    # once let a 300-step job complete before its agent called it converged.
    down = await converged_pod_moves(real_deployment)
    # How long the move took is the benchmark's (tests/k8s/downtime_real_nodes.py): a bound
    # here bet on the kubelets' pace (a loaded machine once took 56 s, nearly all of it the
    # old pod's teardown after the job had checkpointed).
    assert 0 < down.restart <= down.gap


async def test_a_manager_killed_mid_migration_recovers_from_the_api_on_real_nodes(
    real_deployment: Deployment,
) -> None:
    await manager_restart_recovers(real_deployment)


async def test_a_disruption_budget_blocks_the_move_on_a_real_node(
    real_admin: KubeApi, real_namespace: str, real_runtimes: dict[str, KubernetesRuntime]
) -> None:
    await disruption_budget_blocks_the_save(real_admin, real_namespace, real_runtimes, adapt=on_real_node)


async def test_a_job_deaf_to_sigterm_is_killed_by_the_kubelet_and_resumes_from_its_checkpoint(
    real_admin: KubeApi, real_namespace: str, real_volume: Path, real_runtimes: dict[str, KubernetesRuntime]
) -> None:
    # The job is held until the kubelet has killed it (deaf_job_is_killed_and_resumes): in a
    # full run on a loaded machine a real kubelet took 17.8 s to kill the pod, and a 600-step
    # job (12 s) completed first, so nothing was forced.
    await deaf_job_is_killed_and_resumes(
        real_admin, real_namespace, real_volume, real_runtimes, adapt=on_real_node
    )


async def test_a_pods_cpu_weight_lands_in_the_cgroup_its_kubelet_made(
    real_admin: KubeApi, real_namespace: str, real_runtimes: dict[str, KubernetesRuntime]
) -> None:
    """The priority action through a real kubelet: the pod's cgroup is the one the kubelet
    made for it (its QoS class's group under the node's --cgroup-root, cgroupfs driver); the
    agent's runtime finds it by the pod's uid, writes the weight as its cpu.shares and reads
    the pod's CPU seconds from it."""
    rt = real_runtimes["node-1"]
    await create(real_admin, real_namespace, on_real_node(training_pod("weighed", "node-1", steps=10**6)))
    try:
        info = await until(lambda: running(rt, "weighed"), "the pod running")
        pod = real_admin.request("GET", f"/api/v1/namespaces/{real_namespace}/pods/weighed")
        for weight in (10_000, 1):
            assert await rt.set_cpu_weight(info.id, weight)
            rel = rt._cgroups.locate(pod)
            assert rel is not None and rel.name == f"pod{pod['metadata']['uid']}"
            assert rel.parent.name == pod["status"]["qosClass"].lower()  # besteffort: no requests
            assert int((rt._cgroups.cpu_top / rel / "cpu.shares").read_text()) == cpu_shares(weight)
        used = await until(
            lambda: rt._cgroups.cpu_seconds([(info.id, pod)]).get(info.id) or None, "CPU seconds"
        )
        assert used > 0
        # node-2's runtime sees the same cgroup tree here, but the pod is not on its node.
        assert not await real_runtimes["node-2"].set_cpu_weight(info.id, 100)
    finally:
        body = {"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0}
        with contextlib.suppress(KubeError):
            real_admin.request("DELETE", f"/api/v1/namespaces/{real_namespace}/pods/weighed", body=body)


@pytest.fixture
async def daemonset_deployment(
    real_cluster: KubeCluster, real_namespace: str, real_nodes: RealNodes, tmp_path: Path
) -> AsyncIterator[Deployment]:
    async with deployed(
        real_cluster, real_namespace, tmp_path, adapt=on_real_node, agent_pod=daemonset_agent_pod
    ) as d:
        yield d


async def test_the_agent_as_its_daemonset_runs_it_restores_a_job_on_its_node(
    daemonset_deployment: Deployment,
) -> None:
    """Each agent is the DaemonSet's pod, run by its node's kubelet with the manifest's
    credentials (a token projected for the manager; in-cluster API access as its
    ServiceAccount) and its /data mount: the converged job moves from node-1 to node-2."""
    d = daemonset_deployment

    # The kubelets start the agents' pods at their own pace: under a loaded machine an agent
    # came up after the job had trained most of its 400 steps, and the job finished before
    # its agent's ticks could call it converged. Submit once both agents heartbeat; the job is
    # held until its migration is done (converged_pod_moves), however slow the agents' ticks.
    await until(both_agents(d), "both DaemonSet agents heartbeating", timeout=180)
    down = await converged_pod_moves(d)
    admin = KubeApi(d.cluster.api_client())
    for node in ("node-1", "node-2"):
        pod = admin.request("GET", f"/api/v1/namespaces/{d.namespace}/pods/specon-agent-{node}")
        assert pod["status"]["phase"] == "Running" and pod["spec"]["nodeName"] == node
    print(f"\nDAEMONSET AGENTS: training gap {down.gap:.2f} s")
