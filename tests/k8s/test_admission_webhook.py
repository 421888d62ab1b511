"""The manager's pod admission webhook called by a real kube-apiserver (v1.20, the
``MutatingAdmissionWebhook`` plugin, TLS to the manager with the CA in the configuration):
replacement pods of jobs being moved, created all at once, each come out steered to their own
target; a new pod comes out with Algorithm 2's nodes preferred; with the manager down, pods are
still created, unsteered (``failurePolicy: Ignore``); the probe a Job's eviction waits for is
answered only while the webhook serves."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from specon.runtime.kubernetes import steering
from specon.runtime.kubernetes.admission import ANN_PREFERRED
from specon.runtime.kubernetes.api import KubeApi
from specon.runtime.kubernetes.webhook_probe import WebhookProbe
from tests.k8s.cluster import KubeCluster
from tests.k8s.webhook import SELECTOR, WebhookManager, create_at_once, job_pod, registered
from tests.unit.manager_fakes import FakeAgent, FakeClock, report

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

JOBS = 100
TARGETS = ("node-b", "node-c")


@pytest.fixture
def manager(tmp_path: Path, kube_namespace: str) -> Iterator[WebhookManager]:
    m = WebhookManager(tmp_path, kube_namespace, {f"j{i}": TARGETS[i % 2] for i in range(JOBS)}).start()
    try:
        yield m
    finally:
        m.close()


def test_replacements_created_at_once_are_each_steered_to_their_target(
    kube_cluster: KubeCluster, kube_namespace: str, manager: WebhookManager
) -> None:
    with registered(kube_cluster, manager, kube_namespace):
        made = create_at_once(kube_cluster, kube_namespace, [job_pod(f"j{i}") for i in range(JOBS)])
    assert len(made) == JOBS
    for pod, _ in made:
        job = pod["metadata"]["labels"]["specon.io/job"]
        want = TARGETS[int(job[1:]) % 2]
        assert steering.steered_to(pod) == want, pod["metadata"]["name"]
        assert "nodeName" not in pod["spec"]
        (term,) = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
            "nodeSelectorTerms"
        ]
        assert term == {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [want]}]}


def test_a_new_pod_gets_the_nodes_algorithm_2_ranks_first_as_preferences(
    kube_cluster: KubeCluster, kube_namespace: str, manager: WebhookManager
) -> None:
    clock = FakeClock(__import__("time").time())
    shell = manager.shell
    assert shell is not None
    busy, idle = FakeAgent("node-busy", clock), FakeAgent("node-idle", clock)
    manager.call(
        shell.heartbeat(busy.heartbeat(report(f"{kube_namespace}.x1"), report(f"{kube_namespace}.x2")))
    )
    manager.call(shell.heartbeat(idle.heartbeat()))
    with registered(kube_cluster, manager, kube_namespace):
        ((pod, _),) = create_at_once(kube_cluster, kube_namespace, [job_pod("fresh", name="fresh")])
    preferred = pod["spec"]["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    nodes = [(p["weight"], p["preference"]["matchFields"][0]["values"]) for p in preferred]
    assert nodes == [(100, ["node-idle"]), (90, ["node-busy"])]
    assert pod["metadata"]["annotations"][ANN_PREFERRED] == "node-idle,node-busy"
    assert steering.steered_to(pod) is None, "a preference, not a requirement"


def test_with_the_manager_down_pods_are_still_created_unsteered(
    kube_cluster: KubeCluster, kube_namespace: str, manager: WebhookManager
) -> None:
    with registered(kube_cluster, manager, kube_namespace):
        manager.stop()
        made = create_at_once(kube_cluster, kube_namespace, [job_pod(f"j{i}") for i in range(4)])
    assert len(made) == 4
    for pod, seconds in made:
        assert pod["metadata"]["uid"]
        assert not (pod["spec"].get("affinity") or {}), "created as submitted"
        assert seconds < 30


async def test_the_probe_before_a_jobs_eviction_is_answered_only_while_the_webhook_serves(
    kube_cluster: KubeCluster, kube_namespace: str, manager: WebhookManager
) -> None:
    """``webhook_probe``: a dry-run pod through the real admission chain, nothing stored."""
    api = KubeApi(kube_cluster.api_client())
    assert not await WebhookProbe(api, SELECTOR).answers(kube_namespace), "not registered yet"
    with registered(kube_cluster, manager, kube_namespace):
        assert await WebhookProbe(api, SELECTOR).answers(kube_namespace)
        manager.stop()
        assert not await WebhookProbe(api, SELECTOR).answers(kube_namespace), "registered, not serving"
    listed = api.request("GET", f"/api/v1/namespaces/{kube_namespace}/pods")["items"]
    assert listed == [], "a dry run stores no pod"
