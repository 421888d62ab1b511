"""A ``batch/v1`` Job on the real kubelet nodes, with the real Job controller and kube-scheduler
(``cluster.py``; ``nodes.py``) and the manager's admission webhook over TLS.

The Job's pod converges on node-1; the manager moves it: the source's agent evicts the pod
(SIGTERM: it checkpoints), the Job controller creates the replacement at once, the webhook
steers it to node-2 and makes it wait for the evicted copy to end, the target's agent adopts
it, and the Job completes (``succeeded: 1``) with every step trained exactly once.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from specon.coordinator.migration import State
from specon.runtime.kubernetes.backend import KubeApi
from specon.runtime.kubernetes.steering import ANN_ADOPTED, ANN_MOVE, steered_to
from specon.testing.held_jobs import release, release_file
from tests.k8s.cluster import KubeCluster
from tests.k8s.nodes import RealNodes, on_real_node
from tests.k8s.test_e2e_kubernetes import (
    Deployment,
    both_agents,
    converging,
    deployed,
    finished,
    migration_of,
    records,
    steady,
    submit,
)
from tests.k8s.test_real_nodes import trained_exactly
from tests.k8s.test_runtime_kubernetes import held, until
from tests.k8s.webhook import webhook

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(300)]

STEPS = 300


def job_of(pod: dict[str, Any], name: str) -> dict[str, Any]:
    """A Job running ``pod`` once: its labels and spec as the template, the job's identity
    the Job's name (no ``specon.io/job`` label)."""
    template = copy.deepcopy(pod)
    template["metadata"] = {"labels": {"specon.io/managed": "true"}}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {"backoffLimit": 3, "completions": 1, "parallelism": 1, "template": template},
    }


async def submit_job(d: Deployment) -> str:
    """The Job ``trainer`` (its first pod bound to node-1, held until released) beside a
    steady bare pod on node-1, so the manager moves the Job's pod to node-2; its job id."""
    pod = d.adapt(converging("trainer", STEPS, extra=held("trainer")))
    admin = KubeApi(d.cluster.api_client())
    await asyncio.to_thread(
        admin.request, "POST", f"/apis/batch/v1/namespaces/{d.namespace}/jobs", body=job_of(pod, "trainer")
    )
    await submit(d, steady("steady", 800))
    return f"{d.namespace}.trainer"


def succeeded(admin: KubeApi, namespace: str) -> Callable[[], dict[str, Any] | None]:
    """A probe for ``until``: the Job ``trainer`` once it succeeded."""

    def probe() -> dict[str, Any] | None:
        j = admin.request("GET", f"/apis/batch/v1/namespaces/{namespace}/jobs/trainer")
        return j if (j.get("status") or {}).get("succeeded") == 1 else None

    return probe


async def test_a_converged_jobs_pod_moves_and_the_job_completes_with_exactly_its_steps(
    real_cluster: KubeCluster, real_namespace: str, real_nodes: RealNodes, tmp_path: Path
) -> None:
    async with deployed(real_cluster, real_namespace, tmp_path, adapt=on_real_node, webhook=True) as d:
        admin = KubeApi(real_cluster.api_client())
        ns = d.namespace
        await until(both_agents(d), "both agents heartbeating", timeout=120)
        ca = (tmp_path / "ca" / "ca.crt").read_bytes()
        # Registered once both nodes are known: a new pod then gets preferred nodes (the probe).
        probe = d.adapt(steady("probe", 1))
        del probe["spec"]["nodeName"]  # one the scheduler would place
        with webhook(real_cluster, d.webhook_url, ca, ns, probe):
            # The first pod binds to node-1 (nodeName in its template); the replacement is
            # steered (the webhook drops nodeName for a move's pod).
            job = await submit_job(d)
            m = await until(
                migration_of(d, job, lambda x: x.state.value == "done"), "the Job's pod to move", timeout=150
            )
            assert (m.source, m.target, m.reason) == ("node-1", "node-2", "converged")
            release(release_file(d.volume, "trainer"))

            done = await until(succeeded(admin, ns), "the Job to complete", timeout=120)
        assert finished(d.volume, "trainer")
        trained_exactly(d.volume, "trainer", STEPS)
        events = [r.get("event") for r in records(d.volume, "trainer") if "event" in r]
        assert events.count("checkpointed") == 1 and events[-1] == "finished"
        # One eviction counted against backoffLimit (the checkpointing exit), one success.
        assert done["status"].get("failed", 0) <= 1
        selector = {"labelSelector": "job-name=trainer"}
        pods = admin.request("GET", f"/api/v1/namespaces/{ns}/pods", query=selector)["items"]
        (replacement,) = [p for p in pods if (p["metadata"].get("annotations") or {}).get(ANN_MOVE)]
        assert replacement["spec"]["nodeName"] == "node-2"
        assert steered_to({**replacement, "spec": {**replacement["spec"], "nodeName": None}}) == "node-2"
        annotations = replacement["metadata"]["annotations"]
        assert annotations[ANN_MOVE] == m.id and annotations[ANN_ADOPTED] == "true"
        assert replacement["metadata"]["ownerReferences"][0]["kind"] == "Job"
        (record,) = [r for r in d.journal().all() if r.container == job]
        assert record.state is State.DONE
        # `kubectl describe pod` on the replacement, and `kubectl describe job`: what specon did.
        events = admin.request("GET", f"/apis/events.k8s.io/v1/namespaces/{ns}/events")["items"]
        said = {(e["regarding"]["kind"], e["regarding"]["name"], e["reason"]) for e in events}
        name = replacement["metadata"]["name"]
        assert {("Pod", name, "Restored"), ("Pod", name, "Moved"), ("Job", "trainer", "Moved")} <= said, said


async def test_without_the_webhook_a_jobs_pod_is_not_evicted_and_the_job_completes_in_place(
    real_cluster: KubeCluster, real_namespace: str, real_nodes: RealNodes, tmp_path: Path
) -> None:
    """No webhook: the Job's pod was admitted without it (its job holds no run lock), and its
    replacement would be neither steered nor held back until the evicted copy ends, so the save
    refuses to evict (a webhook that stopped answering since: the dry-run probe refuses it,
    tests/unit/runtime/kubernetes/test_job_pods.py). The move fails, the job keeps
    training on node-1 untouched, and the Job completes with every step exactly once."""
    async with deployed(real_cluster, real_namespace, tmp_path, adapt=on_real_node) as d:
        admin = KubeApi(real_cluster.api_client())
        ns = d.namespace
        await until(both_agents(d), "both agents heartbeating", timeout=120)
        job = await submit_job(d)
        m = await until(
            migration_of(d, job, lambda x: x.state.value == "rolled_back"),
            "the move to be refused",
            timeout=150,
        )
        assert (m.source, m.target) == ("node-1", "node-2")
        (record,) = [r for r in d.journal().all() if r.container == job]
        assert "created without the admission webhook" in (record.error or ""), record.error
        release(release_file(d.volume, "trainer"))

        done = await until(succeeded(admin, ns), "the Job to complete", timeout=120)
        assert not done["status"].get("failed")
        trained_exactly(d.volume, "trainer", STEPS)
        events = [r.get("event") for r in records(d.volume, "trainer") if "event" in r]
        assert "checkpointed" not in events, "never stopped"
        (only,) = admin.request(
            "GET", f"/api/v1/namespaces/{ns}/pods", query={"labelSelector": "job-name=trainer"}
        )["items"]
        assert only["spec"]["nodeName"] == "node-1"
