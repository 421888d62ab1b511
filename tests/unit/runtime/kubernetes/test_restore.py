"""Restore records and the no-privilege-gain rule (specon.runtime.kubernetes.restore): no cluster.
The same attacks against the real API server are in tests/k8s/test_restore_security.py."""

from __future__ import annotations

import copy
import re
from collections.abc import Callable
from typing import Any

import pytest

from specon.model import ContainerId
from specon.runtime.kubernetes.pods import LABEL_JOB, PodError, restored_pod, template_of
from specon.runtime.kubernetes.restore import (
    ANN_POD_UID,
    original_from_record,
    privilege_gains,
    record_name,
    record_of,
)
from tests.unit.runtime.kubernetes.test_pods import CONTRACT, pod

JOB = ContainerId("ml.j1")


def original() -> dict[str, Any]:
    return pod("train-1", labels={LABEL_JOB: "j1"}, env=CONTRACT)


def test_a_record_is_a_pod_template_of_the_pod_in_its_own_namespace() -> None:
    rec = record_of(original())
    assert rec["kind"] == "PodTemplate" and rec["metadata"]["namespace"] == "ml"
    assert rec["metadata"]["name"] == record_name(JOB)
    assert rec["metadata"]["annotations"][ANN_POD_UID] == "u-1"
    assert "nodeName" not in rec["template"]["spec"] and "status" not in rec["template"]
    back = original_from_record(rec, JOB)
    assert template_of(back) == template_of(original())
    assert back["metadata"]["namespace"] == "ml"


def test_record_names_are_dns_names_distinct_per_namespace_and_job() -> None:
    names = {record_name(ContainerId(c)) for c in ("ml.j1", "vision.j1", "ml.J1", "ml.j_1", "ml.j-1")}
    assert len(names) == 5
    for n in [*names, record_name(ContainerId("ml." + "x" * 240))]:
        assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", n) and len(n) <= 253


def forged(edit: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    rec = record_of(original())
    edit(rec)
    return rec


@pytest.mark.parametrize(
    ("edit", "why"),
    [
        # A record planted in another namespace is never taken for this job's.
        (lambda r: r["metadata"].update(namespace="kube-system"), "namespace ml"),
        (lambda r: r.update(kind="ConfigMap"), "not a PodTemplate"),
        (lambda r: r.pop("template"), "no pod template"),
        (lambda r: r["template"]["spec"].update(containers=[]), "without containers"),
        # The record of another job (its labels) is not this job's.
        (
            lambda r: r["template"]["metadata"]["labels"].update({LABEL_JOB: "other"}),
            "describes job ml.other",
        ),
    ],
)
def test_a_record_that_is_not_this_jobs_is_refused(edit: Callable[[dict[str, Any]], None], why: str) -> None:
    with pytest.raises(PodError, match=why):
        original_from_record(forged(edit), JOB)


def test_the_copy_made_from_the_original_gains_nothing() -> None:
    orig = original()
    body = restored_pod(
        template_of(orig), job=JOB, node="node-2", gen=2, restored_from="train-1", restore_checkpoint="/x"
    )
    assert privilege_gains(orig, body) == []


def spec_edit(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def edit(p: dict[str, Any]) -> None:
        target = p["spec"]
        *parents, last = path.split(".")
        for part in parents:
            target = target[int(part)] if part.isdigit() else target.setdefault(part, {})
        target[last] = value

    return edit


PRIVILEGED = {"privileged": True}
GAINS = [
    (spec_edit("containers.0.securityContext", PRIVILEGED), "privileged containers/train"),
    (spec_edit("initContainers", [{"name": "i", "image": "x", "securityContext": PRIVILEGED}]), "privileged"),
    (spec_edit("hostNetwork", True), "hostNetwork"),
    (spec_edit("hostPID", True), "hostPID"),
    (spec_edit("hostIPC", True), "hostIPC"),
    (spec_edit("volumes", [{"name": "root", "hostPath": {"path": "/"}}]), "hostPath volume /"),
    (spec_edit("serviceAccountName", "admin"), "service account admin"),
    (spec_edit("containers.0.securityContext", {"capabilities": {"add": ["SYS_ADMIN"]}}), "SYS_ADMIN"),
]


@pytest.mark.parametrize(("edit", "gain"), GAINS)
def test_each_privilege_the_original_lacked_is_a_gain(
    edit: Callable[[dict[str, Any]], None], gain: str
) -> None:
    orig = original()
    candidate = copy.deepcopy(orig)
    edit(candidate)
    assert any(gain in g for g in privilege_gains(orig, candidate)), privilege_gains(orig, candidate)
    # ... and none when the original had it already.
    assert privilege_gains(candidate, copy.deepcopy(candidate)) == []


def test_host_paths_are_held_to_the_originals_and_namespaces_to_its_own() -> None:
    orig = original()
    spec_edit("volumes", [{"name": "d", "hostPath": {"path": "/srv/shared"}}])(orig)
    inside, outside, sneaky = (copy.deepcopy(orig) for _ in range(3))
    spec_edit("volumes", [{"name": "d", "hostPath": {"path": "/srv/shared/jobs"}}])(inside)
    spec_edit("volumes", [{"name": "d", "hostPath": {"path": "/srv/other"}}])(outside)
    spec_edit("volumes", [{"name": "d", "hostPath": {"path": "/srv/shared/../../etc"}}])(sneaky)
    assert privilege_gains(orig, inside) == []
    assert privilege_gains(orig, outside) == ["hostPath volume /srv/other"]
    assert privilege_gains(orig, sneaky) == ["hostPath volume /srv/shared/../../etc"]
    moved = copy.deepcopy(original())
    moved["metadata"]["namespace"] = "kube-system"
    assert privilege_gains(original(), moved) == ["namespace kube-system instead of ml"]


def test_a_token_or_escalation_the_original_opted_out_of_is_a_gain() -> None:
    orig = original()
    spec_edit("automountServiceAccountToken", False)(orig)
    spec_edit("containers.0.securityContext", {"allowPrivilegeEscalation": False})(orig)
    candidate = copy.deepcopy(orig)
    del candidate["spec"]["automountServiceAccountToken"]
    candidate["spec"]["containers"][0]["securityContext"] = {}
    assert privilege_gains(orig, candidate) == [
        "a mounted ServiceAccount token (the original opted out)",
        "privilege escalation in containers/train",
    ]
