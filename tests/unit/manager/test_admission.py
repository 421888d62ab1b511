"""The pod admission webhook (``specon_manager.admission``) on the manager's own state: a
pod of a job being moved is steered to its target, a new pod gets Algorithm 2's nodes as
preferences, and everything else passes unchanged; over HTTP without a credential. The real
API server's side: tests/k8s/test_admission_webhook.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jsonpatch
from aiohttp.test_utils import TestClient, TestServer
from specon_manager.admission import PodAdmission
from specon_manager.app import create_app
from specon_manager.shell import ManagerShell

from specon.coordinator.migration import Migration, State, heading
from specon.model import Category, ContainerId, WorkerId
from specon.runtime.kubernetes import steering
from specon.runtime.kubernetes.admission import (
    ANN_PREFERRED,
    ANN_PROBE_ANSWER,
    WEBHOOK_PATH,
    patch_of,
    probe_pod,
)
from specon.wire.protocol import Action
from tests.unit.manager_fakes import FakeAgent, FakeClock, only, report, shell

CC = Category.CONVERGED
NS = "training"


def job_pod(job: str, *, labels: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    """A pod as a Job controller creates it: generated name, owned by the Job ``job``."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "generateName": f"{job}-",
            "labels": {"specon.io/managed": "true", "job-name": job, **(labels or {})},
            "ownerReferences": [
                {"apiVersion": "batch/v1", "kind": "Job", "name": job, "uid": "j-uid", "controller": True}
            ],
        },
        "spec": {
            "containers": [{"name": "train", "image": "trainer", "resources": {"requests": {"cpu": "1"}}}],
            **spec,
        },
    }


def review(pod: dict[str, Any], *, operation: str = "CREATE", uid: str = "r-1") -> dict[str, Any]:
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": NS,
            "operation": operation,
            "object": pod,
        },
    }


def apply(pod: dict[str, Any], answer: dict[str, Any]) -> dict[str, Any]:
    """``pod`` after the answer's JSON Patch, as the API server applies it."""
    patched: dict[str, Any] = jsonpatch.apply_patch(pod, patch_of(answer))
    return patched


async def moving(tmp_path: Path, clock: FakeClock) -> ManagerShell:
    """b idle; a holds training.c1 (converged, asking) and two progressing jobs: Algorithm 2
    moves training.c1 from a to b (its save is queued)."""
    sh = shell(tmp_path, clock)
    a, b = FakeAgent("a", clock), FakeAgent("b", clock)
    await sh.heartbeat(b.heartbeat())
    batch = await sh.heartbeat(
        a.heartbeat(report(f"{NS}.c1", CC, pending=True), report(f"{NS}.c2"), report(f"{NS}.c3"))
    )
    assert only(batch, Action.SAVE).container == f"{NS}.c1"
    return sh


async def test_the_replacement_of_a_job_being_moved_is_steered_to_the_target(
    tmp_path: Path, clock: FakeClock
) -> None:
    sh = await moving(tmp_path, clock)
    pod = job_pod("c1")
    answer = PodAdmission(sh, "specon.io/managed=true").review(review(pod))
    assert answer["response"]["allowed"] is True and answer["response"]["uid"] == "r-1"
    assert answer["response"]["patchType"] == "JSONPatch"
    placed = apply(pod, answer)
    assert steering.steered_to(placed) == "b"
    assert "nodeName" not in placed["spec"]
    # It waits for the evicted copy to end (a save's time bound and the pod's termination), and
    # holds the run lock in its turn.
    (container,) = placed["spec"]["containers"]
    assert container["env"] == [
        {"name": "SPECON_AWAIT_PREVIOUS", "value": "150"},
        {"name": "SPECON_RUN_LOCK", "value": "1"},
    ]
    assert {k: v for k, v in container.items() if k != "env"} == pod["spec"]["containers"][0]
    # A pod of another job gets preferences, not the move's target as a requirement.
    other = apply(job_pod("c9"), PodAdmission(sh, "specon.io/managed=true").review(review(job_pod("c9"))))
    assert steering.steered_to(other) is None


async def test_a_replacement_whose_template_names_a_node_is_steered_to_the_target_instead(
    tmp_path: Path, clock: FakeClock
) -> None:
    sh = await moving(tmp_path, clock)
    pod = job_pod("c1", nodeName="a")
    placed = apply(pod, PodAdmission(sh, "specon.io/managed=true").review(review(pod)))
    assert "nodeName" not in placed["spec"] and steering.steered_to(placed) == "b"
    # A new pod that names its node gets no preferences: they would change nothing.
    fresh = apply(
        job_pod("c9", nodeName="a"),
        PodAdmission(sh, "specon.io/managed=true").review(review(job_pod("c9", nodeName="a"))),
    )
    assert "affinity" not in fresh["spec"] and fresh["spec"]["nodeName"] == "a"


async def test_a_steered_pod_keeps_the_users_own_required_terms(tmp_path: Path, clock: FakeClock) -> None:
    sh = await moving(tmp_path, clock)
    zone = {"key": "zone", "operator": "In", "values": ["z1"]}
    pod = job_pod(
        "c1",
        affinity={
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [{"matchExpressions": [zone]}]
                }
            }
        },
    )
    placed = apply(pod, PodAdmission(sh, "specon.io/managed=true").review(review(pod)))
    (term,) = placed["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    assert term["matchExpressions"] == [zone]
    assert term["matchFields"] == [{"key": "metadata.name", "operator": "In", "values": ["b"]}]


async def test_a_new_pod_prefers_the_nodes_algorithm_2_ranks_first(tmp_path: Path, clock: FakeClock) -> None:
    sh = shell(tmp_path, clock)
    a, b, c = FakeAgent("a", clock), FakeAgent("b", clock), FakeAgent("c", clock)
    await sh.heartbeat(a.heartbeat(report(f"{NS}.x1"), report(f"{NS}.x2")))
    await sh.heartbeat(b.heartbeat())
    await sh.heartbeat(c.heartbeat(report(f"{NS}.x3")))
    pod = job_pod("new")
    user_term = {
        "weight": 7,
        "preference": {"matchExpressions": [{"key": "disk", "operator": "In", "values": ["ssd"]}]},
    }
    pod["spec"]["affinity"] = {
        "nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [user_term]}
    }
    answer = PodAdmission(sh, "specon.io/managed=true", preferred=2).review(review(pod))
    placed = apply(pod, answer)
    preferred = placed["spec"]["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert preferred[0] == user_term, "the user's own preferences stay, first"
    ranked = [(p["weight"], p["preference"]["matchFields"][0]["values"][0]) for p in preferred[1:]]
    assert ranked == [(100, "b"), (90, "c")], "fewest weighted jobs first; only the 2 asked for"
    assert placed["metadata"]["annotations"][ANN_PREFERRED] == "b,c"
    # Reinvoked on its own output (reinvocationPolicy: IfNeeded), it adds nothing again.
    again = PodAdmission(sh, "specon.io/managed=true").review(review(placed))
    assert patch_of(again) == []


async def test_pods_it_does_not_manage_pass_unchanged(tmp_path: Path, clock: FakeClock) -> None:
    sh = await moving(tmp_path, clock)
    adm = PodAdmission(sh, "specon.io/managed=true")
    unmanaged = job_pod("c1", labels={"specon.io/managed": "false"})
    copy_made_by_specon = job_pod("c1")
    steering.steer(copy_made_by_specon, "a")
    for pod, operation in ((unmanaged, "CREATE"), (copy_made_by_specon, "CREATE"), (job_pod("c1"), "UPDATE")):
        answer = adm.review(review(pod, operation=operation))
        assert answer["response"] == {"uid": "r-1", "allowed": True}
    sh.leading = False  # a standby holds no heartbeats to decide by
    assert "patch" not in adm.review(review(job_pod("c1")))["response"]


async def test_preferences_off_still_steers_moves(tmp_path: Path, clock: FakeClock) -> None:
    sh = await moving(tmp_path, clock)
    adm = PodAdmission(sh, "specon.io/managed=true", preferred=0)
    new = apply(job_pod("c9"), adm.review(review(job_pod("c9"))))
    assert "preferredDuringSchedulingIgnoredDuringExecution" not in str(new), "no preferences"
    assert steering.steered_to(apply(job_pod("c1"), adm.review(review(job_pod("c1"))))) == "b"


async def test_every_pod_a_job_makes_holds_its_run_lock_once(tmp_path: Path, clock: FakeClock) -> None:
    """``SPECON_RUN_LOCK`` on each pod a Job makes (what its replacement waits for), its own
    variables kept, not added again; a bare pod gets none."""
    sh = shell(tmp_path, clock)
    adm = PodAdmission(sh, "specon.io/managed=true")
    pod = job_pod("c9", nodeName="a")
    pod["spec"]["containers"][0]["env"] = [{"name": "MINE", "value": "x"}]
    placed = apply(pod, adm.review(review(pod)))
    assert placed["spec"]["containers"][0]["env"] == [
        {"name": "MINE", "value": "x"},
        {"name": "SPECON_AWAIT_PREVIOUS", "value": "150"},
        {"name": "SPECON_RUN_LOCK", "value": "1"},
    ]
    assert patch_of(adm.review(review(placed))) == []
    bare = job_pod("c9", nodeName="a")
    bare["metadata"]["ownerReferences"] = []
    bare["metadata"]["labels"]["specon.io/job"] = "c9"
    assert patch_of(adm.review(review(bare))) == []


async def test_the_webhook_answers_without_a_credential_and_refuses_what_is_no_review(
    tmp_path: Path, clock: FakeClock
) -> None:
    sh = await moving(tmp_path, clock)
    app = create_app(sh, token="t" * 32, tick=False, extensions=[PodAdmission(sh, "specon.io/managed=true")])
    async with TestClient(TestServer(app)) as client:
        resp = await client.post(WEBHOOK_PATH, json=review(job_pod("c1")))
        assert resp.status == 200
        assert steering.steered_to(apply(job_pod("c1"), await resp.json())) == "b"
        for bad in (
            b"not json",
            b"[]",
            b'{"apiVersion": "admission.k8s.io/v1beta1", "kind": "AdmissionReview"}',
        ):
            resp = await client.post(WEBHOOK_PATH, data=bad, headers={"Content-Type": "application/json"})
            assert resp.status == 400, bad
            assert "AdmissionReview" in (await resp.json())["error"]
        no_pod = review(job_pod("c1"))
        no_pod["request"]["kind"] = {"group": "apps", "version": "v1", "kind": "Deployment"}
        assert (await client.post(WEBHOOK_PATH, json=no_pod)).status == 400
        # Every other POST still needs a token.
        assert (await client.post("/v1/heartbeat", json={})).status == 401
        metrics = await (await client.get("/metrics")).text()
    assert 'specon_admission_reviews_total{outcome="steered"} 1.0' in metrics
    assert 'specon_admission_reviews_total{outcome="invalid"} 4.0' in metrics


def test_an_unreadable_pod_is_left_to_the_scheduler(tmp_path: Path, clock: FakeClock) -> None:
    sh = shell(tmp_path, clock)
    pod = job_pod("c1")
    pod["metadata"]["ownerReferences"] = []
    pod["metadata"]["generateName"] = "x-"  # no name, no Job, no label: no job to name
    answer = PodAdmission(sh, "specon.io/managed=true").review(review(pod))
    assert answer["response"] == {"uid": "r-1", "allowed": True}


async def test_whatever_the_body_holds_the_answer_is_never_a_500(tmp_path: Path, clock: FakeClock) -> None:
    """Bodies that parse but hold odd shapes, or nest too deep to parse: a 200 without a patch
    (counted unread) or a 400, never an error of the server."""
    sh = await moving(tmp_path, clock)
    app = create_app(sh, token="t" * 32, tick=False, extensions=[PodAdmission(sh, "specon.io/managed=true")])
    odd_affinity = job_pod("c9")
    odd_affinity["spec"]["affinity"] = [1]
    no_annotations = job_pod("c1")
    no_annotations["metadata"]["annotations"] = None
    bad_labels = job_pod("c1")
    bad_labels["metadata"]["labels"] = {"specon.io/managed": 1}
    async with TestClient(TestServer(app)) as client:
        for pod in (odd_affinity, no_annotations):
            resp = await client.post(WEBHOOK_PATH, json=review(pod))
            assert resp.status == 200 and (await resp.json())["response"] == {"uid": "r-1", "allowed": True}
        assert (await client.post(WEBHOOK_PATH, json=review(bad_labels))).status == 400
        deep = "[" * 50_000 + "]" * 50_000
        resp = await client.post(WEBHOOK_PATH, data=deep, headers={"Content-Type": "application/json"})
        assert resp.status == 400
        metrics = await (await client.get("/metrics")).text()
    assert 'specon_admission_reviews_total{outcome="unread"} 2.0' in metrics


async def test_a_probe_is_answered_only_for_a_dry_run(tmp_path: Path, clock: FakeClock) -> None:
    """So a pod template cannot carry the probe's annotation past the eviction's check."""
    sh = await moving(tmp_path, clock)
    adm = PodAdmission(sh, "specon.io/managed=true")
    probe = probe_pod(NS, {"specon.io/managed": "true"}, "n-1")
    asked = review(probe)
    assert ANN_PROBE_ANSWER not in str(patch_of(adm.review(asked)))
    asked["request"]["dryRun"] = True
    answered = apply(probe, adm.review(asked))
    assert answered["metadata"]["annotations"][ANN_PROBE_ANSWER] == "n-1"


async def test_a_move_only_decided_steers_nothing(tmp_path: Path, clock: FakeClock) -> None:
    """Nothing was stopped yet: a pod of the job created now is not the move's replacement."""
    m = Migration("m-1", ContainerId(f"{NS}.c1"), WorkerId("a"), WorkerId("b"), "converged")
    assert heading(m, {WorkerId("a"), WorkerId("b")}, ()) is None
    assert heading(m.to(State.SAVING, at=1.0), {WorkerId("a"), WorkerId("b")}, ()) == "b"
