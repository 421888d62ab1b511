"""Steering a restored copy through kube-scheduler (``steering``): the required node affinity
that names its target, kept apart from what the user's pod requires."""

from __future__ import annotations

import copy
from typing import Any

from specon.runtime.kubernetes.steering import ANN_STEERED, steer, steered_to, unschedulable

TARGET = {"key": "metadata.name", "operator": "In", "values": ["node-2"]}
ZONE = {"key": "zone", "operator": "In", "values": ["a", "b"]}


def required(pod: dict[str, Any]) -> list[dict[str, Any]]:
    terms = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    return list(terms["nodeSelectorTerms"])


def test_a_bound_pods_copy_is_unbound_and_required_onto_its_target() -> None:
    pod: dict[str, Any] = {"metadata": {"name": "j"}, "spec": {"nodeName": "node-1", "containers": []}}
    steer(pod, "node-2")
    assert "nodeName" not in pod["spec"]
    assert required(pod) == [{"matchFields": [TARGET]}]
    assert pod["metadata"]["annotations"][ANN_STEERED] == "node-2"
    assert steered_to(pod) == "node-2"


def test_the_target_is_anded_into_every_term_the_user_requires_and_the_rest_is_kept() -> None:
    preferred = [{"weight": 1, "preference": {"matchExpressions": [ZONE]}}]
    pod: dict[str, Any] = {
        "metadata": {"name": "j"},
        "spec": {
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {"matchExpressions": [ZONE]},
                            {"matchFields": [{**TARGET, "values": ["x"]}]},
                        ]
                    },
                    "preferredDuringSchedulingIgnoredDuringExecution": preferred,
                },
                "podAntiAffinity": {"x": 1},
            },
            "nodeSelector": {"gpu": "a100"},
        },
    }
    steer(pod, "node-2")
    assert required(pod) == [
        {"matchExpressions": [ZONE], "matchFields": [TARGET]},
        {"matchFields": [{**TARGET, "values": ["x"]}, TARGET]},  # the user's own pin stays: unschedulable
    ]
    affinity = pod["spec"]["affinity"]
    assert affinity["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"] == preferred
    assert affinity["podAntiAffinity"] == {"x": 1} and pod["spec"]["nodeSelector"] == {"gpu": "a100"}


def test_a_copy_of_a_copy_replaces_the_earlier_steering_instead_of_requiring_two_nodes() -> None:
    pod: dict[str, Any] = {"metadata": {"name": "j"}, "spec": {}}
    steer(pod, "node-1")
    first = copy.deepcopy(pod)
    steer(pod, "node-2")
    assert required(pod) == [{"matchFields": [TARGET]}]
    steer(first, "node-2")
    assert first == pod
    user: dict[str, Any] = {"metadata": {"name": "j"}, "spec": {}}
    steer(user, "node-1")
    required(user)[0]["matchExpressions"] = [ZONE]
    steer(user, "node-2")
    assert required(user) == [{"matchExpressions": [ZONE], "matchFields": [TARGET]}]


def test_where_a_pod_is_or_is_steered_to() -> None:
    assert steered_to({"spec": {"nodeName": "node-1"}}) == "node-1"
    assert steered_to({"spec": {}}) is None
    pod: dict[str, Any] = {"metadata": {}, "spec": {}}
    steer(pod, "node-2")
    assert steered_to(pod) == "node-2"
    # The annotation alone says nothing: every required term must name the node.
    terms = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    terms["nodeSelectorTerms"].append({"matchExpressions": [ZONE]})
    assert steered_to(pod) is None
    assert steered_to({"metadata": {"annotations": {ANN_STEERED: "node-2"}}, "spec": {}}) is None


def test_the_schedulers_reason_is_read_from_the_pod_scheduled_condition() -> None:
    message = "0/2 nodes are available: 1 Insufficient cpu, 1 node(s) didn't match Pod's node affinity."
    pod = {
        "status": {
            "phase": "Pending",
            "conditions": [
                {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message}
            ],
        }
    }
    assert unschedulable(pod) == message
    assert unschedulable({"status": {"phase": "Pending"}}) is None
    assert unschedulable({"status": {"conditions": [{"type": "PodScheduled", "status": "True"}]}}) is None
