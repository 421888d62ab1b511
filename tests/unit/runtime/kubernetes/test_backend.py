"""KubernetesRuntime against kmock (an in-process HTTP Kubernetes emulator): fast checks of
what the runtime asks the API for. The real API server tests are in tests/k8s/."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from specon_agent.__main__ import build_parser, run

from specon import checkpoint as ckpt
from specon.model import ContainerId
from specon.runtime.base import AlreadyRunning, ContainerState, JobSpec, SaveFailed, StartFailed
from specon.runtime.kubernetes import pods as pods_module
from specon.runtime.kubernetes.api import MERGE_PATCH
from specon.runtime.kubernetes.backend import Informer, KubeApi, KubeError, KubernetesRuntime
from specon.runtime.kubernetes.pods import ANN_GENERATION, ANN_RESTORED_FROM, LABEL_JOB, job_spec, template_of
from specon.runtime.kubernetes.restore import record_name, record_of
from specon.runtime.kubernetes.steering import ANN_STEERED, steered_to

# kmock's pytest plugin provides the `kmock` fixture (dev dependency).
pytest.importorskip("kmock")

NS = "ml"


def manifest(
    name: str,
    *,
    node: str = "node-1",
    job: str | None = None,
    managed: bool = True,
    annotations: dict[str, str] | None = None,
    owned: bool = False,
    phase: str = "Running",
    mount: str = "/data",
) -> dict[str, Any]:
    job = job or name
    labels = {LABEL_JOB: job}
    if managed:
        labels["specon.io/managed"] = "true"
    meta: dict[str, Any] = {
        "name": name,
        "namespace": NS,
        "uid": f"uid-{name}",
        "labels": labels,
        "annotations": dict(annotations or {}),
    }
    if owned:
        meta["ownerReferences"] = [
            {"kind": "ReplicaSet", "name": "rs", "uid": "rs-1", "apiVersion": "apps/v1"}
        ]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": {
            "nodeName": node,
            "restartPolicy": "Never",
            "containers": [
                {
                    "name": "train",
                    "image": "specon:0.1.0",
                    "command": ["python", "train.py"],
                    "env": [
                        {"name": "SPECON_PROGRESS_FILE", "value": f"{mount}/jobs/{job}/progress.jsonl"},
                        {"name": "SPECON_CHECKPOINT_DIR", "value": f"{mount}/jobs/{job}/checkpoints"},
                    ],
                    "volumeMounts": [{"name": "data", "mountPath": mount}],
                }
            ],
            "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "specon-data"}}],
        },
        "status": {"phase": phase},
    }


async def bind_steered(api: KubeApi) -> None:
    """kmock has no scheduler: bind each unbound pod to the node it is steered to (as
    kube-scheduler does with a copy that fits; tests/k8s runs the real one)."""
    while True:
        listed = await asyncio.to_thread(api.request, "GET", "/api/v1/pods")
        for p in listed.get("items") or []:
            if not p["spec"].get("nodeName") and (node := steered_to(p)):
                ns, name = p["metadata"]["namespace"], p["metadata"]["name"]
                await asyncio.to_thread(
                    api.request,
                    "PATCH",
                    f"/api/v1/namespaces/{ns}/pods/{name}",
                    body={"spec": {"nodeName": node}},
                    content_type=MERGE_PATCH,
                )
        await asyncio.sleep(0.01)


@pytest.fixture
async def api(kmock: Any) -> AsyncIterator[KubeApi]:
    kmock.resources["v1/pods"] = {"namespaced": True}  # known before any pod exists
    kmock.resources["v1/podtemplates"] = {"namespaced": True}  # restore records
    api, own = (
        KubeApi(client.ApiClient(client.Configuration(host=str(kmock.url).rstrip("/")))) for _ in "12"
    )
    binder = asyncio.create_task(bind_steered(own))  # its own client: not among the calls a test counts
    yield api
    binder.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await binder
    api.client.close()
    own.client.close()


async def create(api: KubeApi, pod: dict[str, Any]) -> None:
    await asyncio.to_thread(api.request, "POST", f"/api/v1/namespaces/{NS}/pods", body=pod)


async def pods(api: KubeApi) -> dict[str, dict[str, Any]]:
    data = await asyncio.to_thread(api.request, "GET", "/api/v1/pods")
    return {p["metadata"]["name"]: p for p in data["items"]}


def runtime(api: KubeApi, tmp_path: Path, node: str = "node-1", **kw: Any) -> KubernetesRuntime:
    kw.setdefault("watch", False)
    return KubernetesRuntime(api, node, volume_root=tmp_path, metrics=False, kill_slack=2.0, **kw)


def evictions(kmock: Any, name: str, status: int = 201) -> list[dict[str, Any]]:
    """Answer the eviction subresource (kmock has none) and record each request body."""
    seen: list[dict[str, Any]] = []

    def react(request: Any) -> dict[str, Any]:
        seen.append(request.data)
        return {"kind": "Status", "status": "Success" if status < 300 else "Failure", "code": status}

    kmock[f"post /api/v1/namespaces/{NS}/pods/{name}/eviction"] << status << react
    return seen


async def test_lists_only_managed_pods_bound_to_its_node(api: KubeApi, tmp_path: Path) -> None:
    await create(api, manifest("a"))
    await create(api, manifest("b", node="node-2"))
    await create(api, manifest("c", managed=False))
    await create(api, manifest("d", mount="/elsewhere") | {"spec": {**manifest("d")["spec"], "volumes": []}})
    await create(api, manifest("e", phase="Succeeded"))
    rt = runtime(api, tmp_path)
    found = {c.id: c for c in await rt.list_containers()}
    # b runs elsewhere, c is not managed, d's files are not on the shared volume (counted).
    assert sorted(found) == [f"{NS}.a", f"{NS}.e"]  # (namespace, job)
    assert rt.skipped == {"unmanageable": 1}
    a = found[ContainerId(f"{NS}.a")]
    assert a.state is ContainerState.RUNNING and a.worker == "node-1" and a.handle == f"{NS}/a"
    assert a.progress_path == tmp_path / "jobs" / "a" / "progress.jsonl"
    assert a.checkpoint_dir == tmp_path / "jobs" / "a" / "checkpoints"
    assert found[ContainerId(f"{NS}.e")].state is ContainerState.EXITED


async def test_watch_cache_serves_the_same_view(api: KubeApi, tmp_path: Path) -> None:
    await create(api, manifest("a"))
    await create(api, manifest("b", node="node-2"))
    rt = runtime(api, tmp_path, watch=True)
    try:
        assert [c.id for c in await rt.list_containers()] == [f"{NS}.a"]
    finally:
        rt.close()


async def test_save_evicts_with_the_grace_period_and_returns_the_new_checkpoint(
    api: KubeApi, kmock: Any, tmp_path: Path
) -> None:
    await create(api, manifest("a"))
    ckpt_dir = tmp_path / "jobs" / "a" / "checkpoints"
    ckpt.write(ckpt_dir, 10, b"old")
    seen = evictions(kmock, "a")

    async def kubelet() -> None:  # what the kubelet and the job do on an eviction
        while not seen:
            await asyncio.sleep(0.01)
        ckpt.write(ckpt_dir, 25, b"new")
        await asyncio.to_thread(api.request, "DELETE", f"/api/v1/namespaces/{NS}/pods/a")

    rt = runtime(api, tmp_path)
    task = asyncio.create_task(kubelet())
    res = await rt.save(ContainerId(f"{NS}.a"), grace=7.2)
    await task
    assert seen[0]["deleteOptions"] == {"gracePeriodSeconds": 8, "preconditions": {"uid": "uid-a"}}
    assert seen[0]["kind"] == "Eviction" and seen[0]["metadata"] == {"name": "a", "namespace": NS}
    assert (res.step, res.rolled_back, res.forced, res.finished) == (25, False, False, False)
    assert res.checkpoint == ckpt_dir / "ckpt-000000000025.json"
    # The restore recipe is in the API: the pod as the API server held it before the eviction.
    record = await asyncio.to_thread(
        api.request, "GET", f"/api/v1/namespaces/{NS}/podtemplates/{record_name(ContainerId(f'{NS}.a'))}"
    )
    assert record["template"]["metadata"]["name"] == "a"
    assert record["metadata"]["annotations"]["specon.io/pod-uid"] == "uid-a"
    # ... which job_spec answers from once the pod is gone, and nothing from the volume.
    (tmp_path / "jobs" / "a" / "spec.json").write_text('{"id": "a", "command": ["forged"]}')
    stored = await asyncio.to_thread(rt.job_spec, ContainerId(f"{NS}.a"))  # blocking: off the loop
    assert stored is not None and stored.id == f"{NS}.a" and stored.template is not None
    assert json.loads(stored.template)["spec"] == template_of(manifest("a"))["spec"]
    assert await rt.list_containers() == []


async def test_eviction_blocked_by_a_disruption_budget_fails_the_save(
    api: KubeApi, kmock: Any, tmp_path: Path
) -> None:
    await create(api, manifest("a"))
    evictions(kmock, "a", status=429)
    rt = runtime(api, tmp_path)
    with pytest.raises(SaveFailed, match="PodDisruptionBudget"):
        await rt.save(ContainerId(f"{NS}.a"), grace=5)
    assert [c.id for c in await rt.list_containers()] == [f"{NS}.a"]  # still running


async def test_opted_out_and_owned_pods_are_never_saved(api: KubeApi, kmock: Any, tmp_path: Path) -> None:
    await create(api, manifest("out", annotations={"specon.io/migratable": "false"}))
    await create(api, manifest("owned", owned=True))
    seen = evictions(kmock, "out") + evictions(kmock, "owned")
    rt = runtime(api, tmp_path)
    # Both are still classified (listed) ...
    assert sorted(c.id for c in await rt.list_containers()) == [f"{NS}.out", f"{NS}.owned"]
    # ... but never saved.
    with pytest.raises(SaveFailed, match="opted out"):
        await rt.save(ContainerId(f"{NS}.out"), grace=5)
    with pytest.raises(SaveFailed, match="owned by ReplicaSet/rs"):
        await rt.save(ContainerId(f"{NS}.owned"), grace=5)
    assert seen == []


async def test_include_owned_saves_owned_pods(api: KubeApi, kmock: Any, tmp_path: Path) -> None:
    await create(api, manifest("owned", owned=True))
    seen = evictions(kmock, "owned", status=429)
    with pytest.raises(SaveFailed, match="PodDisruptionBudget"):
        await runtime(api, tmp_path, include_owned=True).save(ContainerId(f"{NS}.owned"), grace=5)
    assert len(seen) == 1


async def record(api: KubeApi, pod: dict[str, Any]) -> None:
    """The restore record a save writes, as if the pod had just been saved."""
    body = record_of(pod)
    await asyncio.to_thread(api.request, "POST", f"/api/v1/namespaces/{NS}/podtemplates", body=body)


J1 = ContainerId(f"{NS}.j1")


async def test_start_creates_a_pinned_copy_with_lineage(api: KubeApi, tmp_path: Path) -> None:
    original = manifest("train", job="j1", annotations={ANN_GENERATION: "1"})
    await record(api, original)
    ckpt_dir = tmp_path / "jobs" / "j1" / "checkpoints"
    saved = ckpt.write(ckpt_dir, 40, b"state")
    rt = runtime(api, tmp_path, node="node-2")
    info = await rt.start(job_spec(original), checkpoint=saved.manifest)
    created = (await pods(api))["train-g2"]
    assert info.id == J1 and info.worker == "node-2" and info.handle == f"{NS}/train-g2"
    # Created unbound, steered to node-2 for the scheduler to bind (here: ``bind_steered``).
    assert created["spec"]["nodeName"] == "node-2" and created["metadata"]["namespace"] == NS
    assert created["metadata"]["annotations"][ANN_STEERED] == "node-2"
    (term,) = created["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    assert term == {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node-2"]}]}
    assert created["metadata"]["labels"][LABEL_JOB] == "j1"
    assert created["metadata"]["annotations"][ANN_RESTORED_FROM] == "train"
    assert created["metadata"]["annotations"][ANN_GENERATION] == "2"
    env = {e["name"]: e["value"] for e in created["spec"]["containers"][0]["env"]}
    # The agent's mount of the volume, mapped back to the pod's own mount path.
    assert env["SPECON_RESTORE_CHECKPOINT"] == "/data/jobs/j1/checkpoints/ckpt-000000000040.json"
    assert created["spec"]["volumes"] == original["spec"]["volumes"]


async def test_start_ignores_the_spec_it_is_given_but_its_id(api: KubeApi, tmp_path: Path) -> None:
    """A forged save result (what the manager relays) cannot choose what runs, or where."""
    original = manifest("train", job="j1")
    await record(api, original)
    evil = template_of(manifest("evil", job="j1"))
    evil["metadata"]["namespace"] = "kube-system"
    evil["spec"]["hostNetwork"] = True
    evil["spec"]["containers"][0]["command"] = ["/bin/sh", "-c", "id > /host/owned"]
    evil["spec"]["containers"][0]["securityContext"] = {"privileged": True}
    forged = JobSpec(id=J1, command=("/bin/sh", "-c", "id"), template=json.dumps(evil))
    await runtime(api, tmp_path, node="node-2").start(forged)
    (created,) = (await pods(api)).values()
    assert created["metadata"]["namespace"] == NS and created["metadata"]["name"] == "train-g2"
    assert created["spec"]["containers"][0]["command"] == ["python", "train.py"]
    assert "hostNetwork" not in created["spec"] and "securityContext" not in created["spec"]["containers"][0]


async def test_start_refuses_a_copy_that_would_gain_privileges(api: KubeApi, tmp_path: Path) -> None:
    original = manifest("train", job="j1")
    await record(api, original)
    rt = runtime(api, tmp_path, node="node-2")
    real = pods_module.restored_pod

    def escalating(*args: Any, **kw: Any) -> dict[str, Any]:  # a restore that went wrong
        body = real(*args, **kw)
        body["spec"]["hostPID"] = True
        return body

    pods_module.restored_pod = escalating  # type: ignore[assignment]
    try:
        with pytest.raises(StartFailed, match="would gain what pod ml/train lacked: hostPID"):
            await rt.start(job_spec(original))
    finally:
        pods_module.restored_pod = real  # type: ignore[assignment]
    assert await pods(api) == {}


async def test_start_refuses_while_a_pod_of_the_job_lives_anywhere(api: KubeApi, tmp_path: Path) -> None:
    live = manifest("train", job="j1", node="node-1")
    await create(api, live)
    rt = runtime(api, tmp_path, node="node-2")
    with pytest.raises(AlreadyRunning, match="node-1"):
        await rt.start(job_spec(live))
    assert sorted(await pods(api)) == ["train"]


async def test_start_replaces_ended_pods_of_the_job(api: KubeApi, tmp_path: Path) -> None:
    ended = manifest("train", job="j1", node="node-1", phase="Failed")
    await create(api, ended)  # no record: the ended pod itself is the original
    await runtime(api, tmp_path, node="node-2").start(job_spec(ended))
    assert sorted(await pods(api)) == ["train-g2"]


async def test_start_checks_the_checkpoint(api: KubeApi, tmp_path: Path) -> None:
    original = manifest("train", job="j1")
    await record(api, original)
    spec = job_spec(original)
    rt = runtime(api, tmp_path)
    foreign = ckpt.write(tmp_path / "jobs" / "other" / "checkpoints", 5, b"x")
    with pytest.raises(StartFailed, match="not in the job's checkpoint directory"):
        await rt.start(spec, checkpoint=foreign.manifest)
    bad = ckpt.write(tmp_path / "jobs" / "j1" / "checkpoints", 5, b"x")
    bad.payload.write_bytes(b"rot")
    with pytest.raises(StartFailed, match="does not verify"):
        await rt.start(spec, checkpoint=bad.manifest)
    assert await pods(api) == {}


async def test_start_without_a_pod_or_a_record_fails(api: KubeApi, tmp_path: Path) -> None:
    rt = runtime(api, tmp_path)
    with pytest.raises(StartFailed, match="no pod of the job and no restore record"):
        await rt.start(JobSpec(id=ContainerId(f"{NS}.j9"), command=("python",)))
    with pytest.raises(StartFailed, match="not a Kubernetes job id"):
        await rt.start(JobSpec(id=ContainerId("j9"), command=("python",)))
    assert await asyncio.to_thread(rt.job_spec, ContainerId(f"{NS}.j9")) is None


async def test_a_namespaced_runtime_starts_only_its_namespace(api: KubeApi, tmp_path: Path) -> None:
    with pytest.raises(StartFailed, match="not one of this agent's: other"):
        await runtime(api, tmp_path, namespace="other").start(JobSpec(id=J1, command=("python",)))


class ScriptedWatch:
    """A KubeApi stand-in whose watch replays scripted events (the 410 path, without a
    server old enough to produce one)."""

    def __init__(self, events: list[dict[str, Any]]) -> None:
        self.events = events

    def watch(self, path: str, query: dict[str, str], *, seconds: int, on_open: Any) -> Any:
        assert query["resourceVersion"] == "7"
        yield from self.events


def test_watch_asks_for_a_relist_on_410_gone_and_fails_on_other_errors() -> None:
    pod = manifest("a") | {"metadata": {**manifest("a")["metadata"], "resourceVersion": "9"}}
    gone = {"type": "ERROR", "object": {"kind": "Status", "code": 410, "reason": "Expired"}}
    inf = Informer(ScriptedWatch([{"type": "ADDED", "object": pod}, gone]), "/api/v1/pods", name="t")  # type: ignore[arg-type]
    assert inf._watch("7") is None
    assert [o["metadata"]["name"] for o in inf.items()] == ["a"]
    denied = {"type": "ERROR", "object": {"kind": "Status", "code": 403, "reason": "Forbidden"}}
    inf = Informer(ScriptedWatch([denied]), "/api/v1/pods", name="t")  # type: ignore[arg-type]
    with pytest.raises(KubeError, match="403"):
        inf._watch("7")
    ok = Informer(ScriptedWatch([{"type": "DELETED", "object": pod}]), "/api/v1/pods", name="t")  # type: ignore[arg-type]
    assert ok._watch("7") == "9"


class FlakyList:
    """A KubeApi stand-in whose list fails ``failures`` times, then answers; its watch
    expires at once (410), so the informer relists."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.lists: list[float] = []

    def request(self, method: str, path: str, *, query: Any = None) -> Any:
        self.lists.append(time.monotonic())
        if len(self.lists) <= self.failures:
            raise KubeError(0, "Unavailable", "down")
        return {"metadata": {"resourceVersion": "7"}, "items": [manifest("a")]}

    def watch(self, path: str, query: dict[str, str], *, seconds: int, on_open: Any) -> Any:
        time.sleep(0.05)
        yield {"type": "ERROR", "object": {"kind": "Status", "code": 410, "reason": "Expired"}}


@pytest.mark.slow
def test_watch_thread_backs_off_while_the_list_fails_and_stops_at_once() -> None:
    api = FlakyList(failures=2)
    inf = Informer(api, "/api/v1/pods", name="t")  # type: ignore[arg-type]
    pauses: list[float] = []
    real_pause = inf._pause

    def pause(seconds: float) -> None:
        pauses.append(seconds)
        real_pause(seconds)

    inf._pause = pause  # type: ignore[method-assign]
    inf.start()
    deadline = time.monotonic() + 10
    while not inf.synced and time.monotonic() < deadline:
        time.sleep(0.02)
    assert inf.synced and inf.errors == 2
    assert [o["metadata"]["name"] for o in inf.items()] == ["a"]
    assert pauses[:2] == [0.5, 1.0]  # 0.5 s, then doubled
    # ... and waited out: a gap is never shorter (a busy machine makes it longer, by any amount).
    gaps = [b - a for a, b in zip(api.lists, api.lists[1:], strict=False)][:2]
    assert gaps[0] >= 0.45 and gaps[1] >= 0.95
    down = Informer(FlakyList(failures=10**6), "/api/v1/pods", name="down")  # type: ignore[arg-type]
    down.start()
    deadline = time.monotonic() + 10
    while down.errors < 1 and time.monotonic() < deadline:  # its first list failed: in its backoff
        time.sleep(0.01)
    inf.stop()
    down.stop()  # in its backoff: the wait ends at once
    assert inf._thread is not None and down._thread is not None
    inf._thread.join(3)
    down._thread.join(3)
    assert not inf._thread.is_alive() and not down._thread.is_alive()
    assert down.errors == 1


async def test_agent_cli_needs_a_node_and_a_configuration(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("SPECON_TOKEN", "0123456789abcdef" * 4)  # strong enough to pass the check
    monkeypatch.delenv("NODE_NAME", raising=False)
    args = build_parser().parse_args(["--runtime", "kubernetes", "--volume", str(tmp_path)])
    assert await run(args) == 2
    assert "--node or $NODE_NAME" in capsys.readouterr().err
    monkeypatch.setenv("NODE_NAME", "node-1")  # the DaemonSet's downward API
    bad = tmp_path / "kubeconfig"
    bad.write_text("not: a kubeconfig")
    args = build_parser().parse_args(
        ["--runtime", "kubernetes", "--volume", str(tmp_path), "--kubeconfig", str(bad)]
    )
    assert args.node == "node-1"
    assert await run(args) == 2
    assert "no Kubernetes configuration" in capsys.readouterr().err


async def test_cpu_weight_goes_to_the_pods_cgroup_and_its_cpu_seconds_come_back(
    api: KubeApi, tmp_path: Path
) -> None:
    """The runtime finds the live pod of the job on its node and its cgroup (v1, cgroupfs
    driver, BestEffort: no requests) under the node's mounted /sys/fs/cgroup."""
    await create(api, manifest("a"))
    await create(api, manifest("gone", phase="Succeeded"))
    root = tmp_path / "cgroup"
    for hierarchy in ("cpu", "cpuacct"):
        (root / hierarchy / "kubepods" / "besteffort" / "poduid-a").mkdir(parents=True)
    (root / "cpu" / "cpu.shares").write_text("1024\n")
    (root / "cpuacct" / "kubepods" / "besteffort" / "poduid-a" / "cpuacct.usage").write_text("7000000000\n")
    rt = runtime(api, tmp_path, cgroup_root=root)
    assert await rt.set_cpu_weight(ContainerId(f"{NS}.a"), 400)
    assert (root / "cpu" / "kubepods" / "besteffort" / "poduid-a" / "cpu.shares").read_text() == "4096"
    assert not await rt.set_cpu_weight(ContainerId(f"{NS}.gone"), 400)  # not running: no weight
    assert not await rt.set_cpu_weight(ContainerId(f"{NS}.nowhere"), 400)
    usage = await rt.usage()
    assert dict(usage.per_container) == {ContainerId(f"{NS}.a"): 7.0}
    limited = {c.id: c.cpu_limit for c in await rt.list_containers()}
    assert limited == {ContainerId(f"{NS}.a"): None, ContainerId(f"{NS}.gone"): None}


async def test_without_the_nodes_cgroups_a_weight_is_refused(api: KubeApi, tmp_path: Path) -> None:
    await create(api, manifest("a"))
    rt = runtime(api, tmp_path, cgroup_root=tmp_path / "not-mounted")
    assert not await rt.set_cpu_weight(ContainerId(f"{NS}.a"), 100)
    assert (await rt.usage()).per_container == ()
