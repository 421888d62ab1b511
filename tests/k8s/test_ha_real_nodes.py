"""The HA component's manager replicas run by real kubelets (``nodes.py``): each kubelet probes
its replica's ``/healthz`` as the Deployment says, so "2/2 Ready" is what the kubelets report,
not what the manifests promise. One replica leads (it holds the Lease and labels its own pod
``specon.io/leader=true``, which the Service selects); when its pod is deleted the other takes
the Lease and the label, and stays Ready throughout. The same with ``components/fronts`` added:
each replica's fronts answer the probes and the standby's pass its protocol POSTs on to its
decider. (The test control plane runs no Deployment controller: the two pods are the ones it
would create, one per node.)"""

from __future__ import annotations

import contextlib
import copy
import os
import time
from pathlib import Path
from typing import Any

import pytest
from specon_manager.leader_pod import LEADER_LABEL

from specon.runtime.kubernetes.backend import KubeApi, KubeError
from tests.k8s.cluster import KubeCluster, free_ports
from tests.k8s.nodes import RealNodes, on_real_node
from tests.k8s.test_e2e_kubernetes import POLICY
from tests.k8s.test_manifests import MANIFESTS, by_kind, render
from tests.k8s.test_real_nodes import in_cluster
from tests.k8s.test_runtime_kubernetes import until

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(300)]


def ha_template(tmp_path: Path, components: tuple[str, ...] = ("ha",)) -> dict[str, Any]:
    """The manager Deployment's pod template with ``components`` (no TLS or read token: they
    need Secrets that this test has no use for)."""
    rel = os.path.relpath(MANIFESTS, tmp_path)
    listed = ", ".join(f"{rel}/components/{c}" for c in components)
    (tmp_path / "kustomization.yaml").write_text(f"resources: [{rel}/base]\ncomponents: [{listed}]\n")
    (deployment,) = by_kind(render(tmp_path))["Deployment"]
    assert deployment["spec"]["replicas"] == 2
    return dict(deployment["spec"]["template"])


def replica(
    template: dict[str, Any], cluster: KubeCluster, name: str, node: str, port: int
) -> dict[str, Any]:
    """The pod the Deployment controller would make of ``template``, on ``node``: the kubelets
    here share the host's network, so each replica listens on a loopback port of its own and
    its probes ask there (``httpGet.host``)."""
    spec = copy.deepcopy(template["spec"])
    spec["nodeName"] = node
    c = spec["containers"][0]
    c["args"] = [f"--listen=127.0.0.1:{port}" if a.startswith("--listen=") else a for a in c["args"]]
    for probe in ("readinessProbe", "livenessProbe"):
        c[probe]["httpGet"].update({"host": "127.0.0.1", "port": port})
    c.pop("ports", None)
    # components/fronts asks 3 cores; the test kubelets' nodes have 2 (and run the rest too).
    c["resources"]["requests"]["cpu"] = "100m"
    for v in spec["volumes"]:
        if v["name"] == "policy":  # the generated (hash-suffixed) name: ours
            v["configMap"]["name"] = "specon-policy"
    in_cluster(spec, cluster)
    labels = dict(template["metadata"]["labels"])
    return on_real_node(
        {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": labels}, "spec": spec}
    )


def _listening(port: int) -> int:
    """Sockets listening on TCP ``port`` of 127.0.0.1 (the kubelets share the host network)."""
    rows = Path("/proc/net/tcp").read_text().splitlines()[1:]
    return sum(1 for r in rows if r.split()[1] == f"0100007F:{port:04X}" and r.split()[3] == "0A")


def ready(pod: dict[str, Any]) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


@pytest.mark.parametrize("components", [("ha",), ("ha", "fronts")])
async def test_both_ha_replicas_are_ready_on_their_kubelets_and_one_leads(
    real_cluster: KubeCluster,
    real_namespace: str,
    real_nodes: RealNodes,
    tmp_path: Path,
    components: tuple[str, ...],
) -> None:
    ns, admin = real_namespace, KubeApi(real_cluster.api_client())
    template = ha_template(tmp_path, components)
    admin.request(
        "POST", f"/api/v1/namespaces/{ns}/serviceaccounts", body={"metadata": {"name": "specon-manager"}}
    )
    for name, data in (
        ("kube-root-ca.crt", {"ca.crt": real_cluster.ca_file.read_text()}),
        ("specon-policy", {"policy.yaml": POLICY}),
    ):
        cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": data}
        admin.request("POST", f"/api/v1/namespaces/{ns}/configmaps", body=cm)
    pods = f"/api/v1/namespaces/{ns}/pods"
    names = {"manager-a": "node-1", "manager-b": "node-2"}
    ports = free_ports(2)
    for (name, node), port in zip(names.items(), ports, strict=True):
        admin.request("POST", pods, body=replica(template, real_cluster, name, node, port))

    def replicas() -> dict[str, dict[str, Any]]:
        listed = admin.request("GET", pods, query={"labelSelector": "app.kubernetes.io/name=specon-manager"})
        return {p["metadata"]["name"]: p for p in listed["items"]}

    def leaders() -> list[str]:  # what the Service selects
        selector = f"app.kubernetes.io/name=specon-manager,{LEADER_LABEL}=true"
        return [
            p["metadata"]["name"]
            for p in admin.request("GET", pods, query={"labelSelector": selector})["items"]
        ]

    async def all_ready(want: set[str]) -> bool | None:
        found = replicas()
        return (set(found) == want and all(ready(p) for p in found.values()) and len(leaders()) == 1) or None

    t0 = time.monotonic()
    await until(lambda: all_ready(set(names)), "2/2 Ready by the kubelets' probes, one leader", timeout=180)
    up = time.monotonic() - t0
    # Each replica listens once per front (SO_REUSEPORT), or once: the host network shows it.
    assert [_listening(port) for port in ports] == [2 if "fronts" in components else 1] * 2
    (first,) = leaders()
    # The leader's pod goes (a node drained, a rollout): the other takes over, Ready throughout.
    other = next(n for n in names if n != first)
    admin.request("DELETE", f"{pods}/{first}", body={"gracePeriodSeconds": 5})
    t1 = time.monotonic()

    def took_over() -> bool:
        assert ready(replicas()[other]), "the standby stopped being Ready while it took over"
        return leaders() == [other]

    await until(took_over, f"{other} to lead", timeout=120)
    assert leaders() == [other] and ready(replicas()[other])
    print(f"\nHA ON KUBELETS: 2/2 Ready and one leader {up:.1f} s after creation; {other} led "
          f"{time.monotonic() - t1:.1f} s after {first}'s pod was deleted")  # fmt: skip
    with contextlib.suppress(KubeError):
        admin.request("DELETE", f"{pods}/{other}", body={"gracePeriodSeconds": 0})
