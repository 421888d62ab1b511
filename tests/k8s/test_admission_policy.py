"""manifests/components/admission-policy: the ValidatingAdmissionPolicy that holds the pods the
manager creates to a restored copy's shape. The test API server (v1.20) serves no such
policy, so its CEL is evaluated here with cel-python against the pod the manager's writer
builds for a real training pod (admitted) and against pods that break each rule (refused)."""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any

import celpy
import pytest
from celpy.adapter import json_to_cel

from specon.model import ContainerId
from specon.runtime.kubernetes.copying import restored_copy
from specon.runtime.kubernetes.pods import SharedVolume
from specon.runtime.kubernetes.steering import ANN_STEERED
from tests.k8s.test_manifests import MANIFESTS, by_kind, render
from tests.k8s.test_runtime_kubernetes import training_pod

MANAGER = "system:serviceaccount:specon:specon-manager"


@pytest.fixture(scope="module")
def policy(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    overlay = tmp_path_factory.mktemp("overlay")
    rel = os.path.relpath(MANIFESTS, overlay)
    (overlay / "kustomization.yaml").write_text(
        f"resources: [{rel}]\ncomponents: [{rel}/components/admission-policy]\n"
    )
    docs = by_kind(render(overlay))
    (pol,) = docs["ValidatingAdmissionPolicy"]
    (binding,) = docs["ValidatingAdmissionPolicyBinding"]
    assert binding["spec"] == {"policyName": pol["metadata"]["name"], "validationActions": ["Deny"]}
    assert pol["spec"]["failurePolicy"] == "Fail"
    return dict(pol)


def _eval(expression: str, **variables: Any) -> bool:
    env = celpy.Environment()
    result = env.program(env.compile(expression)).evaluate({k: json_to_cel(v) for k, v in variables.items()})
    return bool(result)


def refusals(policy: dict[str, Any], pod: dict[str, Any], user: str = MANAGER) -> list[str]:
    """The messages of the rules ``pod`` breaks, created by ``user`` (none: admitted)."""
    request = {"userInfo": {"username": user}, "operation": "CREATE"}
    if not all(_eval(c["expression"], request=request) for c in policy["spec"]["matchConditions"]):
        return []
    return [v["message"] for v in policy["spec"]["validations"] if not _eval(v["expression"], object=pod)]


def restored(pod: dict[str, Any]) -> dict[str, Any]:
    """The copy the manager's writer creates of ``pod`` (``writes.PodWrites.create``)."""
    original = {**pod, "metadata": {**pod["metadata"], "namespace": "training", "uid": "u1"}}
    return restored_copy(
        original,
        [],
        job=ContainerId("training.r1"),
        node="node-2",
        volume=SharedVolume(),
        checkpoint=None,
        source_labels={},
        node_labels=None,
    )


def test_the_copy_the_manager_makes_of_a_training_pod_is_admitted(policy: dict[str, Any]) -> None:
    assert refusals(policy, restored(training_pod("r1", "node-1"))) == []


def _set(path: str, value: Any) -> Any:
    def change(pod: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        at: Any = pod
        for key in parents:
            at = at[int(key)] if key.isdigit() else at.setdefault(key, {})
        at[last] = value

    return change


def _add_term(term: dict[str, Any]) -> Any:
    def change(pod: dict[str, Any]) -> None:
        required = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        required["nodeSelectorTerms"].append(term)

    return change


@pytest.mark.parametrize(
    ("change", "refused"),
    [
        (_set("spec.containers.0.securityContext", {"privileged": True}), "no privileged container"),
        (_set("spec.initContainers", [{"name": "i", "securityContext": {"privileged": True}}]), "privileged"),
        (_set("spec.containers.0.securityContext", {"capabilities": {"add": ["SYS_ADMIN"]}}), "capability"),
        (_set("spec.hostNetwork", True), "host namespace"),
        (_set("spec.hostPID", True), "host namespace"),
        (_set("spec.volumes", [{"name": "root", "hostPath": {"path": "/"}}]), "hostPath"),
        (_set("metadata.labels", {"app": "x"}), "managed pods of a job"),
        (_set("metadata.annotations", {}), "restored copies"),
        # Bound past the scheduler, unsteered, steered to another node than it says, or
        # allowed onto other nodes by a second term.
        (_set("spec.nodeName", "node-3"), "through the scheduler"),
        (_set("spec.affinity", {}), "through the scheduler"),
        (lambda pod: pod["metadata"]["annotations"].update({ANN_STEERED: "node-3"}), "through the scheduler"),
        (_add_term({"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}), "scheduler"),
    ],
)
def test_a_pod_the_manager_must_not_create_is_refused(
    policy: dict[str, Any], change: Any, refused: str
) -> None:
    pod = copy.deepcopy(restored(training_pod("r1", "node-1")))
    change(pod)
    assert any(refused in m for m in refusals(policy, pod)), refusals(policy, pod)


def test_only_the_managers_creates_are_checked(policy: dict[str, Any]) -> None:
    """Everyone else's pods are Pod Security Admission's (and their own RBAC's) to judge."""
    privileged = training_pod("x", "node-1")
    privileged["spec"]["containers"][0]["securityContext"] = {"privileged": True}
    assert refusals(policy, privileged, user="system:serviceaccount:training:default") == []
    assert refusals(policy, privileged, user="system:serviceaccount:specon:specon-agent") == []
    assert refusals(policy, privileged) != []


def test_the_component_is_not_in_the_default_deployment() -> None:
    """It needs Kubernetes 1.30; the manifests apply to older servers without it."""
    assert "ValidatingAdmissionPolicy" not in by_kind(render(MANIFESTS))
    assert (Path(MANIFESTS) / "components" / "admission-policy" / "kustomization.yaml").is_file()
