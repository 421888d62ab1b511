"""Every object specon renders or creates, validated strictly (no unknown field) against the
Kubernetes 1.28-1.37 schemas of the ``kubernetes-validate`` package; 1.20, where the test
cluster runs, is the API server's own check (``test_manifests.py``: every object applies
server-side, and the runtime's calls run against it).

Rendered: ``manifests/`` as ``kubectl apply -k`` takes it, the base with each component, the
dry-run overlay and the examples. Created: what the code sends in a create or replace, caught
by a recording API: a restored copy and its restore record (the manager's writer), an
Eviction, an Event (agent's and manager's), the journal's Migrations and ConfigMaps, the leader's Lease,
a TokenReview. Kinds no Kubernetes release defines (the Prometheus operator's ServiceMonitor and
PrometheusRule) are left to their own CRDs; the ValidatingAdmissionPolicy is v1 from 1.30."""

from __future__ import annotations

import asyncio
import copy
import os
from dataclasses import replace
from pathlib import Path
from typing import Any

import jsonpatch
import jsonschema
import kubernetes_validate as kv
import pytest
from specon_manager.auth_kubernetes import TokenReviewAuthenticator
from specon_manager.k8s_crd_journal import CrdJournal
from specon_manager.k8s_events import MigrationEvents
from specon_manager.leader import LeaseElector

from specon.coordinator.migration import Mark, Migration, State
from specon.model import ContainerId, WorkerId
from specon.runtime.kubernetes.admission import steering_patch
from specon.runtime.kubernetes.api import KubeApi, KubeError
from specon.runtime.kubernetes.webhook_probe import WebhookProbe
from specon.runtime.kubernetes.writes import PodRef, PodWrites
from tests.k8s.test_manifests import MANIFESTS, render
from tests.k8s.test_runtime_kubernetes import training_pod

VERSIONS = [f"1.{minor}.0" for minor in range(28, 38)]
# The Prometheus operator's CRDs, and specon's own (checked against its CRD's schema below).
NOT_IN_KUBERNETES = {"monitoring.coreos.com/v1", "specon.io/v1alpha1"}
SINCE = {("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicy"): 30,
         ("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicyBinding"): 30}  # fmt: skip


def rendered(work: Path) -> list[tuple[str, dict[str, Any]]]:
    """(where, object) for every object of every shipped way to apply the manifests (the
    overlays written under ``work``)."""
    out = [("manifests/", d) for d in render(MANIFESTS)]
    for component in sorted(p.name for p in (MANIFESTS / "components").iterdir() if p.is_dir()):
        overlay = work / component
        overlay.mkdir()
        rel = os.path.relpath(MANIFESTS, overlay)
        (overlay / "kustomization.yaml").write_text(
            f"resources: [{rel}/base, {rel}/training]\ncomponents: [{rel}/components/{component}]\n"
        )
        out += [(f"components/{component}", d) for d in render(overlay)]
    for extra in ("overlays/dry-run", "examples"):
        out += [(extra, d) for d in render(MANIFESTS / extra)]
    return out


class Recording(KubeApi):
    """An API that answers reads from ``objects`` and records every create and replace."""

    def __init__(self, objects: dict[str, Any]) -> None:  # no client: nothing is sent
        self.objects = objects
        self.sent: list[tuple[str, dict[str, Any]]] = []

    def request(self, method: str, path: str, **kw: Any) -> Any:
        if method == "GET":
            if path in self.objects:
                return copy.deepcopy(self.objects[path])
            if path.endswith("/pods"):  # a list
                return {"items": [o for p, o in self.objects.items() if p.startswith(path + "/")]}
            raise KubeError(404, "NotFound", path)
        body = kw.get("body")
        if method in ("POST", "PUT") and isinstance(body, dict) and "kind" in body:
            self.sent.append((f"{method} {path}", copy.deepcopy(body)))
        if method == "POST" and isinstance(body, dict) and body.get("kind") == "TokenReview":
            return {**body, "status": {"authenticated": False}}
        return {**(body if isinstance(body, dict) else {}), "metadata": {"resourceVersion": "1", "uid": "u2"}}


def created() -> list[tuple[str, dict[str, Any]]]:
    """What the code sends: a restore's copy and record, an eviction, Events, the journal, a
    Lease, a TokenReview."""
    pod = training_pod("r1", "node-1")
    pod["metadata"].update({"namespace": "training", "uid": "u1", "resourceVersion": "7"})
    pod["status"] = {"phase": "Running", "startTime": "2026-01-01T00:00:00Z"}
    ended = copy.deepcopy(pod)
    ended["status"]["phase"] = "Succeeded"
    node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-1", "labels": {}}}
    api = Recording({
        "/api/v1/namespaces/training/pods/r1": pod,
        "/api/v1/nodes/node-1": node,
        "/api/v1/nodes/node-2": {**node, "metadata": {"name": "node-2"}},
    })  # fmt: skip
    job = ContainerId("training.r1")
    moved = Migration("m1", job, WorkerId("node-1"), WorkerId("node-2"), "converged", State.SAVING, 1.0, 1.0)
    writes = PodWrites(api)

    async def run() -> None:
        await writes.evict(job, PodRef("training", "r1", "u1"), "node-1", 30.0)  # record + Eviction
        api.objects["/api/v1/namespaces/training/pods/r1"] = ended
        await writes.create(job, "node-2", None, False, token="m1:start:node-2:0")  # the copy
        events = MigrationEvents(api)
        events.recorder.record(pod, "Normal", "Saved", "Save", "checkpoint at step 40 in 1.2 s")
        events.on_migration(replace(moved, state=State.DONE))
        await events.drain()
        who = TokenReviewAuthenticator(api, audience="specon-manager", service_account="specon/specon-agent")
        await who.authenticate("eyJhbGciOiJSUzI1NiJ9.eyJleHAiOjF9.c2lnbmF0dXJl")  # a JWT's shape
        await WebhookProbe(api, "specon.io/managed=true").answers("training")  # a dry-run pod

    asyncio.run(run())
    journal = CrdJournal(api, "specon", mirror_pods=False)
    journal.put(moved)
    journal.put(moved.to(State.SAVED, at=2.0, checkpoint="/data/c.json", checkpoint_step=4, stopped_at=1.5))
    journal.put_mark(Mark(job, 3.0, 1, 0))
    journal.set_meta("epoch", "1")
    elector = LeaseElector(api, namespace="specon", name="specon-manager", identity="m-1")
    elector._write(None, create=True)
    # What the admission webhook makes of a Job's replacement for a move (a JSON Patch the API
    # server applies): steered, its nodeName dropped, waiting for the evicted copy.
    replacement = copy.deepcopy(pod)
    replacement["metadata"]["ownerReferences"] = [
        {"apiVersion": "batch/v1", "kind": "Job", "name": "r1", "uid": "j1", "controller": True}
    ]
    patched = jsonpatch.apply_patch(
        replacement, steering_patch(replacement, "node-2", move="m1", await_previous=150)
    )
    api.sent.append(("admission webhook", patched))
    kinds = {b["kind"] for _, b in api.sent}
    assert {
        "Pod",
        "PodTemplate",
        "Eviction",
        "Event",
        "ConfigMap",
        "Lease",
        "TokenReview",
        "Migration",
    } <= kinds
    return api.sent


def _check(obj: dict[str, Any], version: str) -> None:
    minor = int(version.split(".")[1])
    since = SINCE.get((obj["apiVersion"], obj["kind"]))
    if since is not None and minor < since:
        with pytest.raises(kv.SchemaNotFoundError):
            kv.validate(obj, version, strict=True)
        return
    kv.validate(obj, version, strict=True)


@pytest.fixture(scope="module")
def objects(tmp_path_factory: pytest.TempPathFactory) -> list[tuple[str, dict[str, Any]]]:
    return [*rendered(tmp_path_factory.mktemp("overlays")), *created()]


@pytest.mark.parametrize("version", VERSIONS)
def test_every_object_specon_renders_or_creates_is_valid_for(
    version: str, objects: list[tuple[str, dict[str, Any]]]
) -> None:
    problems = []
    for where, obj in objects:
        if obj["apiVersion"] in NOT_IN_KUBERNETES:
            continue
        try:
            _check(obj, version)
        except (kv.ValidationError, kv.SchemaNotFoundError) as exc:
            problems.append(
                f"{where} {obj['kind']}/{obj['metadata'].get('name')}: {str(exc).splitlines()[0]}"
            )
    assert not problems, "\n".join(problems)


def test_the_objects_checked_cover_every_kind_shipped(objects: list[tuple[str, dict[str, Any]]]) -> None:
    kinds = {o["kind"] for _, o in objects}
    assert {
        "Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding",
        "ConfigMap", "PersistentVolumeClaim", "PersistentVolume", "Service", "Deployment", "DaemonSet",
        "PodDisruptionBudget", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding",
        "Pod", "PodTemplate", "Eviction", "Event", "Lease", "TokenReview", "CustomResourceDefinition",
        "Migration",
    } <= kinds, kinds  # fmt: skip


def strict(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` with no field it does not name (what kubernetes-validate's strict mode does
    for the built-in kinds): the API server would prune one silently."""
    out = copy.deepcopy(schema)
    if "properties" in out:
        out["properties"] = {k: strict(v) for k, v in out["properties"].items()}
        out.setdefault("additionalProperties", False)
    if "items" in out:
        out["items"] = strict(out["items"])
    return out


def test_every_migration_the_journal_writes_is_valid_for_its_crd(
    objects: list[tuple[str, dict[str, Any]]],
) -> None:
    (crd,) = [o for w, o in objects if w == "manifests/" and o["kind"] == "CustomResourceDefinition"]
    (version,) = crd["spec"]["versions"]
    schema = strict(version["schema"]["openAPIV3Schema"])
    schema["properties"]["metadata"] = {"type": "object"}  # ObjectMeta: the API server's own check
    migrations = [o for _, o in objects if o["kind"] == "Migration"]
    assert {m["apiVersion"] for m in migrations} == {f"{crd['spec']['group']}/{version['name']}"}
    assert any("status" in m for m in migrations) and any(
        "checkpoint" in m.get("status", {}) for m in migrations
    )
    for m in migrations:
        jsonschema.validate(m, schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**migrations[0], "spec": {**migrations[0]["spec"], "target": "x"}}, schema)
