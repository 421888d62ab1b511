"""KubernetesRuntime against a real kube-apiserver, with the kubelet stand-in running each
bound pod's command as a local process: save by eviction, restore on another node, the
PodDisruptionBudget refusal, the never-twice guard, a forced save, watch resync."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
from kubernetes import client
from specon_manager.k8s_crd_journal import CrdJournal

from specon import checkpoint as ckpt
from specon.coordinator.migration import Mark, Migration, State
from specon.model import ContainerId, WorkerId
from specon.runtime.base import AlreadyRunning, ContainerInfo, SaveFailed
from specon.runtime.kubernetes.backend import Informer, KubeApi, KubeError, KubernetesRuntime
from specon.runtime.kubernetes.pods import ANN_GENERATION, ANN_RESTORED_FROM, LABEL_JOB
from specon.testing.held_jobs import RELEASE, finished_steps, release, release_file
from specon.testing.progress_log import job_records
from tests.k8s.cluster import KubeCluster
from tests.k8s.kubelet import FakeKubelet

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(180)]

CURVE_JOB = Path(__file__).resolve().parents[1] / "integration" / "jobs" / "curve_job.py"
CLAIM = "specon-data"
T = TypeVar("T")


async def until(probe: Callable[[], Awaitable[T | None] | T | None], what: str, timeout: float = 60.0) -> T:
    deadline = time.monotonic() + timeout
    while True:
        got = probe()
        value = await got if asyncio.iscoroutine(got) else got
        if value is not None and value is not False:
            return value  # type: ignore[return-value]
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.1)


def shared_volume(api: KubeApi, namespace: str, root: Path) -> None:
    """A PV on ``root`` bound to the claim ``specon-data`` in ``namespace`` (pre-bound: no
    PV controller runs here)."""
    root.mkdir(parents=True, exist_ok=True)
    pv = f"specon-data-{namespace}"
    api.request(
        "POST",
        "/api/v1/persistentvolumes",
        body={
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {"name": pv},
            "spec": {
                "capacity": {"storage": "1Gi"},
                "accessModes": ["ReadWriteMany"],
                "storageClassName": "",
                "claimRef": {"namespace": namespace, "name": CLAIM},
                "hostPath": {"path": str(root)},
            },
        },
    )
    claim = api.request(
        "POST",
        f"/api/v1/namespaces/{namespace}/persistentvolumeclaims",
        body={
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            # The PV controller's mark of a finished binding: the scheduler places a pod that
            # mounts the claim only with it.
            "metadata": {"name": CLAIM, "annotations": {"pv.kubernetes.io/bind-completed": "yes"}},
            "spec": {
                "accessModes": ["ReadWriteMany"],
                "storageClassName": "",
                "volumeName": pv,
                "resources": {"requests": {"storage": "1Gi"}},
            },
        },
    )
    # What the PV controller would write (none runs here): a real kubelet mounts a claim only
    # when it is Bound and its PV's claimRef names it by uid (the stand-in does not look).
    merge = "application/merge-patch+json"
    uid = claim["metadata"]["uid"]
    api.request(
        "PATCH",
        f"/api/v1/persistentvolumes/{pv}",
        body={"spec": {"claimRef": {"uid": uid}}},
        content_type=merge,
    )
    api.request(
        "PATCH",
        f"/api/v1/persistentvolumes/{pv}/status",
        body={"status": {"phase": "Bound"}},
        content_type=merge,
    )
    bound = {"status": {"phase": "Bound", "accessModes": ["ReadWriteMany"], "capacity": {"storage": "1Gi"}}}
    api.request(
        "PATCH",
        f"/api/v1/namespaces/{namespace}/persistentvolumeclaims/{CLAIM}/status",
        body=bound,
        content_type=merge,
    )


def training_pod(
    name: str,
    node: str,
    *,
    job: str | None = None,
    steps: int = 200,
    step_seconds: float = 0.02,
    extra: tuple[str, ...] = (),
    annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    """A pod following the job contract: the curve job writing under its /data mount."""
    job = job or name
    argv = ["python", str(CURVE_JOB), "--steps", str(steps), "--step-seconds", str(step_seconds)]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "labels": {"specon.io/managed": "true", LABEL_JOB: job},
            "annotations": dict(annotations or {}),
        },
        "spec": {
            "nodeName": node,
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 30,
            "containers": [
                {
                    "name": "train",
                    "image": "specon:0.1.0",
                    "command": [*argv, "--checkpoint-every", "25", *extra],
                    "env": [
                        {"name": "SPECON_PROGRESS_FILE", "value": f"/data/jobs/{job}/progress.jsonl"},
                        {"name": "SPECON_CHECKPOINT_DIR", "value": f"/data/jobs/{job}/checkpoints"},
                    ],
                    "volumeMounts": [{"name": "data", "mountPath": "/data"}],
                }
            ],
            "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": CLAIM}}],
        },
    }


def records(volume: Path, job: str) -> list[dict[str, Any]]:
    return job_records(volume, job)


def trained(volume: Path, job: str) -> list[int]:
    return [int(r["step"]) for r in records(volume, job) if "loss" in r]


# A job the test must act on while it runs (evict it, have it killed, move it) is started
# held: it trains its steps and then goes on training until the test releases it (curve_job's
# ``--until-released``), so no loaded machine can let it complete before the test has acted.


def held(job: str) -> tuple[str, str]:
    """The curve job's arguments holding ``job`` until :func:`release`: the file, on the pod's
    ``/data`` mount (the stand-in kubelet maps the path; a real node mounts the claim there)."""
    return ("--until-released", f"/data/jobs/{job}/{RELEASE}")


@pytest.fixture
def admin(kube_api: client.ApiClient) -> KubeApi:
    return KubeApi(kube_api)


@pytest.fixture
def volume(admin: KubeApi, kube_namespace: str, tmp_path: Path) -> Iterator[Path]:
    root = tmp_path / "shared"
    shared_volume(admin, kube_namespace, root)
    yield root
    admin.request("DELETE", f"/api/v1/persistentvolumes/specon-data-{kube_namespace}")


@contextlib.contextmanager
def node_runtimes(
    cluster: KubeCluster, namespace: str, volume: Path, *, kill_slack: float
) -> Iterator[dict[str, KubernetesRuntime]]:
    """A KubernetesRuntime per node, node-1 and node-2, closed afterwards."""
    made = {
        node: KubernetesRuntime(
            cluster.api_client(), node, volume_root=volume, namespace=namespace, kill_slack=kill_slack
        )
        for node in ("node-1", "node-2")
    }
    try:
        yield made
    finally:
        for rt in made.values():
            rt.close()


@pytest.fixture
def runtimes(
    kube_cluster: KubeCluster, kube_namespace: str, volume: Path, fake_kubelet: FakeKubelet
) -> Iterator[dict[str, KubernetesRuntime]]:
    with node_runtimes(kube_cluster, kube_namespace, volume, kill_slack=5.0) as made:
        yield made


async def create(admin: KubeApi, namespace: str, pod: dict[str, Any]) -> None:
    await asyncio.to_thread(admin.request, "POST", f"/api/v1/namespaces/{namespace}/pods", body=pod)


async def running(rt: KubernetesRuntime, job: str) -> ContainerInfo | None:
    """The job's container, if it runs on ``rt``'s node (``job``: ``<namespace>.<job>``, or
    a bare job name in the runtime's namespace)."""
    for info in await rt.list_containers():
        if job in (info.id, info.id.partition(".")[2]) and info.alive:
            return info
    return None


async def test_lists_its_nodes_pods_and_reads_their_progress_on_the_volume(
    admin: KubeApi, kube_namespace: str, volume: Path, runtimes: dict[str, KubernetesRuntime]
) -> None:
    await create(admin, kube_namespace, training_pod("a", "node-1"))
    await create(admin, kube_namespace, training_pod("b", "node-2"))
    info = await until(lambda: running(runtimes["node-1"], "a"), "pod a listed on node-1")
    assert [c.id for c in await runtimes["node-1"].list_containers()] == [f"{kube_namespace}.a"]
    assert info.progress_path == volume / "jobs" / "a" / "progress.jsonl"
    # The pod's writes through its PVC mount land where the agent's mount reads them.
    await until(lambda: len(trained(volume, "a")) >= 5, "progress records from pod a")
    usage = await runtimes["node-1"].usage()
    assert usage.capacity.cpu == 4 and 0.0 <= usage.cpu_utilisation <= 1.0
    assert runtimes["node-1"].node_labels.get("specon.io/test-node") == "true"


async def test_save_by_eviction_then_restore_on_another_node_runs_exactly_its_steps(
    admin: KubeApi, kube_namespace: str, volume: Path, runtimes: dict[str, KubernetesRuntime]
) -> None:
    steps = 300
    # Held: it is still training when the eviction's SIGTERM lands, however slow the machine.
    pod = training_pod("train", "node-1", job="j1", steps=steps, extra=held("j1"))
    await create(admin, kube_namespace, pod)
    info = await until(lambda: running(runtimes["node-1"], "j1"), "j1 running on node-1")
    await until(lambda: len(trained(volume, "j1")) >= 60, "j1 past step 60")
    res = await runtimes["node-1"].save(ContainerId(f"{kube_namespace}.j1"), grace=10)
    assert not res.forced and not res.rolled_back and not res.finished
    assert res.step is not None and res.checkpoint is not None
    assert res.checkpoint.parent == volume / "jobs" / "j1" / "checkpoints"
    assert [r.get("event") for r in records(volume, "j1")][-1] == "checkpointed"
    assert await running(runtimes["node-1"], "j1") is None  # the pod is gone
    release(release_file(volume, "j1"))  # saved: the restored job may finish

    started = await runtimes["node-2"].start(info.spec, checkpoint=res.checkpoint)
    assert started.worker == "node-2" and started.handle == f"{kube_namespace}/train-g2"
    pod = await asyncio.to_thread(admin.request, "GET", f"/api/v1/namespaces/{kube_namespace}/pods/train-g2")
    assert pod["spec"]["nodeName"] == "node-2"
    assert pod["metadata"]["annotations"][ANN_RESTORED_FROM] == "train"
    assert pod["metadata"]["annotations"][ANN_GENERATION] == "2"
    env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
    assert env["SPECON_RESTORE_CHECKPOINT"] == f"/data/jobs/j1/checkpoints/{res.checkpoint.name}"

    await until(
        lambda: any(r.get("event") == "finished" for r in records(volume, "j1")), "j1 to finish", timeout=90
    )
    total = finished_steps(volume, "j1")
    assert total >= steps
    assert sorted(trained(volume, "j1")) == list(range(1, total + 1))  # each step exactly once
    ended = await until(lambda: _ended(runtimes["node-2"], "j1"), "node-2 to see j1 ended")
    assert ended.finished and ended.exit_code == 0
    # What `kubectl describe pod` shows: the save on the evicted pod, the restore on its copy.
    for rt in runtimes.values():
        await rt.events.drain()
    listed = await asyncio.to_thread(
        admin.request, "GET", f"/apis/events.k8s.io/v1/namespaces/{kube_namespace}/events"
    )
    said = {
        (e["regarding"]["name"], e["reason"]): e
        for e in listed["items"]
        if e.get("reportingController") == "specon.io/agent"
    }
    assert {("train", "Saving"), ("train", "Saved"), ("train-g2", "Restored")} <= said.keys()
    assert said["train", "Saved"]["note"].startswith(f"checkpoint at step {res.step}, in ")
    restored = said["train-g2", "Restored"]
    assert restored["reportingInstance"] == "specon-agent-node-2" and restored["type"] == "Normal"
    assert restored["note"] == (
        f"restored on node node-2 from the checkpoint at step {res.step}, generation 2, after pod train"
    )
    assert restored["regarding"]["uid"] == pod["metadata"]["uid"]
    assert all(rt.events.counters.failed == 0 for rt in runtimes.values())


async def _ended(rt: KubernetesRuntime, job: str) -> ContainerInfo | None:
    for info in await rt.list_containers():
        if job in (info.id, info.id.partition(".")[2]) and not info.alive:
            return info
    return None


async def test_start_refuses_while_the_job_runs_anywhere(
    admin: KubeApi, kube_namespace: str, runtimes: dict[str, KubernetesRuntime]
) -> None:
    await create(
        admin, kube_namespace, training_pod("train", "node-1", job="j2", steps=2000, extra=held("j2"))
    )
    info = await until(lambda: running(runtimes["node-1"], "j2"), "j2 running on node-1")
    with pytest.raises(AlreadyRunning, match="node-1"):
        await runtimes["node-2"].start(info.spec)


async def test_a_disruption_budget_blocks_the_save_and_the_pod_keeps_running(
    admin: KubeApi, kube_namespace: str, runtimes: dict[str, KubernetesRuntime]
) -> None:
    await disruption_budget_blocks_the_save(admin, kube_namespace, runtimes)


async def test_a_job_deaf_to_sigterm_is_killed_and_resumes_from_its_checkpoint(
    admin: KubeApi, kube_namespace: str, volume: Path, runtimes: dict[str, KubernetesRuntime]
) -> None:
    await deaf_job_is_killed_and_resumes(admin, kube_namespace, volume, runtimes)


# -- scenarios, shared with test_real_nodes.py (the same logic on real kubelets) -----------------

Adapt = Callable[[dict[str, Any]], dict[str, Any]]


def _as_is(pod: dict[str, Any]) -> dict[str, Any]:
    return pod


async def disruption_budget_blocks_the_save(
    admin: KubeApi, namespace: str, runtimes: dict[str, KubernetesRuntime], adapt: Adapt = _as_is
) -> None:
    """An eviction refused by a PodDisruptionBudget fails the save; the pod keeps running."""
    # Held (never released: the namespace's teardown stops it): it must still run at the end.
    await create(
        admin, namespace, adapt(training_pod("guarded", "node-1", steps=2000, extra=held("guarded")))
    )
    await until(lambda: running(runtimes["node-1"], "guarded"), "guarded running")

    async def phase_running() -> bool:
        pod = await asyncio.to_thread(admin.request, "GET", f"/api/v1/namespaces/{namespace}/pods/guarded")
        return bool(pod.get("status", {}).get("phase") == "Running")

    # The API server lets any eviction of a Pending pod through, budget or not: under load
    # the kubelet's Running status can lag the process the runtime already sees.
    await until(phase_running, "the API server to see guarded Running")
    pdb = {
        "apiVersion": "policy/v1beta1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": "keep"},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {LABEL_JOB: "guarded"}}},
    }
    await asyncio.to_thread(
        admin.request, "POST", f"/apis/policy/v1beta1/namespaces/{namespace}/poddisruptionbudgets", body=pdb
    )
    with pytest.raises(SaveFailed, match="PodDisruptionBudget"):
        await runtimes["node-1"].save(ContainerId(f"{namespace}.guarded"), grace=5)
    assert await running(runtimes["node-1"], "guarded") is not None
    pod = await asyncio.to_thread(admin.request, "GET", f"/api/v1/namespaces/{namespace}/pods/guarded")
    assert "deletionTimestamp" not in pod["metadata"]  # never asked to stop


async def deaf_job_is_killed_and_resumes(
    admin: KubeApi,
    namespace: str,
    volume: Path,
    runtimes: dict[str, KubernetesRuntime],
    *,
    adapt: Adapt = _as_is,
    steps: int = 300,
) -> None:
    """A job that ignores SIGTERM is killed at the grace period; its newest periodic
    checkpoint is the save's result, and the restored pod resumes from it and finishes.

    The job is held (:func:`held`) until the kill: a kubelet may take many seconds to kill it
    (a real one under load took 17.8 s), and a job that completed first was never forced."""
    pod = adapt(training_pod("deaf", "node-1", steps=steps, extra=("--ignore-sigterm", *held("deaf"))))
    # A kubelet 1.20 sometimes stops the container with the pod's own grace period instead of
    # the eviction's (containerd's log: "StopContainer ... with timeout 30"): keep both short.
    pod["spec"]["terminationGracePeriodSeconds"] = 2
    await create(admin, namespace, pod)
    info = await until(lambda: running(runtimes["node-1"], "deaf"), "deaf running")
    checkpoints = volume / "jobs" / "deaf" / "checkpoints"
    await until(lambda: ckpt.latest_complete(checkpoints), "a periodic checkpoint")
    res = await runtimes["node-1"].save(ContainerId(f"{namespace}.deaf"), grace=1)
    print(
        "DEAF",
        [(r.get("event"), r.get("step"), r["ts"]) for r in records(volume, "deaf") if "event" in r],
        time.time(),
    )
    assert res.forced
    # Its newest periodic checkpoint is the result: a restart redoes the steps after it.
    latest = ckpt.latest_complete(checkpoints)
    assert latest is not None and res.checkpoint == latest.manifest and res.step == latest.step
    assert "checkpointed" not in [r.get("event") for r in records(volume, "deaf")]
    assert await running(runtimes["node-1"], "deaf") is None
    release(release_file(volume, "deaf"))  # killed: the restored job may finish

    await runtimes["node-2"].start(info.spec, checkpoint=res.checkpoint)
    await until(
        lambda: any(r.get("event") == "finished" for r in records(volume, "deaf")),
        "deaf to finish",
        timeout=90,
    )
    recs = records(volume, "deaf")
    restart = next(i for i, r in enumerate(recs) if r.get("event") == "started" and r.get("resumed"))
    after = [int(r["step"]) for r in recs[restart:] if "loss" in r]
    total = finished_steps(volume, "deaf")
    assert total >= steps
    assert recs[restart]["step"] == res.step and after == list(range(res.step + 1, total + 1))


def test_watch_resumes_from_the_last_version(kube_cluster: KubeCluster, kube_namespace: str) -> None:
    api = KubeApi(kube_cluster.api_client())
    path = f"/api/v1/namespaces/{kube_namespace}/configmaps"
    inf = Informer(api, path, name="t", watch_seconds=2)
    version = inf._relist()
    assert inf.synced and version and inf.items() == []
    api.request("POST", path, body={"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "a"}})
    api.request("POST", path, body={"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "b"}})
    api.request("DELETE", f"{path}/a")
    # One watch request (the server ends it after 2 s) replays what happened since `version`.
    newer = inf._watch(version)
    assert newer is not None and int(newer) > int(version)
    assert [o["metadata"]["name"] for o in inf.items()] == ["b"]
    with pytest.raises(KubeError) as err:
        api.request("GET", f"{path}/none-such")
    assert err.value.status == 404


def test_journal_marks_survive_concurrent_writers(kube_cluster: KubeCluster, kube_namespace: str) -> None:
    """Read-modify-write with resourceVersion: two writers interleaving lose no update
    (a job's mark is a key of its shard ConfigMap, which other writers change too)."""
    journals = [CrdJournal(KubeApi(kube_cluster.api_client()), kube_namespace) for _ in range(2)]
    # Each writer's names carry its index: distinct keys by construction (never id() or hash()).
    batches = [
        [Mark(ContainerId(f"w{w}-c{i}"), float(10 * w + i), 1, w) for i in range(10)]
        for w in range(len(journals))
    ]
    written = {mk.container: mk for batch in batches for mk in batch}

    def work(j: CrdJournal, batch: list[Mark]) -> None:
        for mk in batch:
            j.put_mark(mk)

    threads = [threading.Thread(target=work, args=(j, b)) for j, b in zip(journals, batches, strict=True)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(written) == 20
    assert journals[0].marks() == written


def test_journal_round_trips_migrations(kube_cluster: KubeCluster, kube_namespace: str) -> None:
    j = CrdJournal(KubeApi(kube_cluster.api_client()), kube_namespace, mirror_pods=False)
    m = Migration("m1a2b-1", ContainerId("Job_A.1"), WorkerId("node-1"), WorkerId("node-2"), "converged")
    j.put(m)
    done = m.to(State.SAVING, at=1.0).to(State.SAVED, at=2.0, checkpoint="/data/x.json", spec='{"id": "x"}')
    j.put(done.to(State.RESTORING, at=3.0).to(State.RUNNING, at=4.0, started_at=4.0).to(State.DONE, at=5.0))
    j.put(
        Migration("m2", ContainerId("b"), WorkerId("node-1"), WorkerId("node-3"), "rebalance", decided_at=9.0)
    )
    assert [x.id for x in j.in_flight()] == ["m2"]
    assert [x.id for x in j.all()] == ["m1a2b-1", "m2"]
    got = j.get("m1a2b-1")
    assert got is not None and got.state is State.DONE and got.checkpoint == "/data/x.json"
    assert j.get("nope") is None
    # Ids that are not DNS names still get distinct Migration names.
    assert j.migration_name("A_b") != j.migration_name("a-b")
