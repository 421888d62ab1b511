"""A Job's pods on kmock: a save evicts one only once the admission webhook answered a probe
in its namespace; a start adopts the Job controller's replacement steered to its node, which
its agent does not list before; a replacement that went elsewhere fails the start. The real
Job controller and kube-scheduler: tests/k8s/test_job_real_nodes.py."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from specon import checkpoint as ckpt
from specon.model import ContainerId
from specon.runtime.base import SaveFailed, StartFailed
from specon.runtime.kubernetes.adopting import adopted
from specon.runtime.kubernetes.backend import KubeApi
from specon.runtime.kubernetes.pods import job_spec
from specon.runtime.kubernetes.restore import original_from_record, record_of
from specon.runtime.kubernetes.steering import ANN_ADOPTED, ANN_MOVE, steer
from specon.runtime.kubernetes.webhook_probe import WebhookProbe
from specon.runtime.kubernetes.writes import PodRef
from tests.unit.runtime.kubernetes.test_backend import (
    NS,
    api,
    create,
    evictions,
    manifest,
    pods,
    record,
    runtime,
)

pytest.importorskip("kmock")
__all__ = ["api"]  # the fixture, used by name

JOB = ContainerId(f"{NS}.trainer")


def job_pod(name: str, *, node: str | None = "node-1", admitted: bool = True) -> dict[str, Any]:
    """A pod of the Job ``trainer`` (its controller's; no ``specon.io/job`` label), as the
    webhook ``admitted`` it (holding its run lock)."""
    pod = manifest(name, node=node or "node-1", job="trainer")
    if admitted:
        container = pod["spec"]["containers"][0]
        container["env"] = [*(container.get("env") or []), {"name": "SPECON_RUN_LOCK", "value": "1"}]
    del pod["metadata"]["labels"]["specon.io/job"]
    pod["metadata"]["ownerReferences"] = [
        {"apiVersion": "batch/v1", "kind": "Job", "name": "trainer", "uid": "job-1", "controller": True}
    ]
    if node is None:
        del pod["spec"]["nodeName"]
    return pod


async def test_a_jobs_pod_is_evicted_only_once_the_webhook_answers(
    api: KubeApi, kmock: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """kmock has no admission (the real API server's answer to the probe:
    tests/k8s/test_admission_webhook.py): the probe is made to say no, then yes."""
    await create(api, job_pod("unadmitted", admitted=False))
    rt = runtime(api, tmp_path)
    with pytest.raises(SaveFailed, match="created without the admission webhook: its job holds no run lock"):
        await rt.save(ContainerId(f"{NS}.trainer"), grace=5)
    await asyncio.to_thread(api.request, "DELETE", f"/api/v1/namespaces/{NS}/pods/unadmitted")
    await create(api, job_pod("trainer-x1"))
    seen = evictions(kmock, "trainer-x1", status=429)  # a PDB: the pod stays, the save fails after
    asked: list[str] = []
    answering = False

    async def answers(self: WebhookProbe, namespace: str) -> bool:
        asked.append(namespace)
        return answering

    monkeypatch.setattr(WebhookProbe, "answers", answers)
    with pytest.raises(SaveFailed, match="admission webhook does not answer in namespace ml"):
        await rt.save(JOB, grace=5)
    assert seen == [], "never evicted without the webhook"
    answering = True
    with pytest.raises(SaveFailed, match="PodDisruptionBudget"):
        await rt.save(JOB, grace=5)
    assert len(seen) == 1 and asked == [NS, NS]


async def test_a_start_adopts_the_controllers_replacement_its_agent_did_not_list(
    api: KubeApi, tmp_path: Path
) -> None:
    evicted = job_pod("trainer-x1")
    await record(api, evicted)
    original = original_from_record(record_of(evicted), JOB)
    replacement = job_pod("trainer-x2", node=None)
    steer(replacement, "node-2")
    replacement["metadata"]["annotations"][ANN_MOVE] = "m-1"
    await create(api, replacement)
    target = runtime(api, tmp_path, node="node-2")
    saved = ckpt.write(tmp_path / "jobs" / "trainer" / "checkpoints", 40, b"state")
    # Bound to node-2 (by the scheduler), but not the job's there until a start adopts it.
    assert [c.id for c in await target.list_containers()] == []
    info = await target.start(job_spec(original), checkpoint=saved.manifest)
    assert info.handle == f"{NS}/trainer-x2" and info.id == JOB
    now = await pods(api)
    assert sorted(now) == ["trainer-x2"], "no pod made: the controller's was adopted"
    assert now["trainer-x2"]["metadata"]["annotations"][ANN_ADOPTED] == "true"
    assert [c.id for c in await target.list_containers()] == [JOB]


async def test_a_start_fails_when_the_controllers_pod_went_elsewhere(api: KubeApi, tmp_path: Path) -> None:
    await create(api, job_pod("trainer-x2", node="node-3"))  # no webhook: the scheduler chose
    original = original_from_record(record_of(job_pod("trainer-x1")), JOB)
    with pytest.raises(StartFailed, match=r"elsewhere .*trainer-x2 on node-3.*admission webhook"):
        await runtime(api, tmp_path, node="node-2", placement_deadline=5).start(job_spec(original))


async def test_a_replacement_steered_before_the_move_turned_is_withdrawn_for_the_next() -> None:
    """A rollback's start on node-2 finds the Job's pod still Pending, steered to node-3 (where
    the move went first): it withdraws it, and adopts the controller's next pod, steered here."""
    stale = job_pod("trainer-x2", node=None)
    steer(stale, "node-3")
    stale["metadata"]["annotations"][ANN_MOVE] = "m-1"
    fresh = job_pod("trainer-x3", node="node-2")
    steer(fresh, "node-2")
    fresh["spec"]["nodeName"] = "node-2"  # bound by the scheduler
    withdrawn: list[PodRef] = []
    listed = [[stale], [fresh]]

    async def list_pods() -> list[dict[str, Any]]:
        return listed[min(len(withdrawn), 1)]

    async def read(ref: PodRef) -> dict[str, Any] | None:
        return fresh if ref.name == "trainer-x3" else None

    async def withdraw(ref: PodRef) -> None:
        withdrawn.append(ref)

    marked: list[tuple[str, dict[str, str]]] = []

    async def mark(ref: PodRef, annotations: Mapping[str, str]) -> bool:
        marked.append((ref.name, dict(annotations)))
        return True

    got = await adopted(
        JOB, "node-2", list_pods=list_pods, read=read, withdraw=withdraw, mark=mark, deadline=10
    )
    assert got is fresh and [r.name for r in withdrawn] == ["trainer-x2"]
    assert marked == [("trainer-x3", {ANN_ADOPTED: "true"})]
    # One bound elsewhere ran there: the start fails, saying where (the job runs on node-3).
    stale["spec"]["nodeName"] = "node-3"
    listed[0] = [stale]
    withdrawn.clear()
    with pytest.raises(StartFailed, match="trainer-x2 on node-3"):
        await adopted(
            JOB, "node-2", list_pods=list_pods, read=read, withdraw=withdraw, mark=mark, deadline=10
        )
    assert withdrawn == []
