"""The Eviction call on both API versions that serve it (``calls.PodCalls.evict``):
``policy/v1`` from Kubernetes 1.22, ``policy/v1beta1`` before (the test cluster, 1.20, takes
that path for real: tests/k8s)."""

from __future__ import annotations

from typing import Any, cast

import pytest

from specon.model import ContainerId
from specon.runtime.base import SaveFailed
from specon.runtime.kubernetes.api import KubeApi, KubeError
from specon.runtime.kubernetes.calls import PodCalls

POD = {"metadata": {"name": "j1", "namespace": "training", "uid": "u1"}}
JOB = ContainerId("training.j1")


class Server:
    """Serves the Eviction versions in ``served``; records what it was sent."""

    def __init__(self, *served: str, refuse: int | None = None) -> None:
        self.served, self.refuse = served, refuse
        self.sent: list[dict[str, Any]] = []

    def request(self, method: str, path: str, **kw: Any) -> Any:
        body = kw["body"]
        self.sent.append(body)
        if body["apiVersion"] not in self.served:  # what a 1.20 server answers for policy/v1
            raise KubeError(
                404, "NotFound", f"the server could not find the requested resource ({body['apiVersion']})"
            )
        if self.refuse:
            raise KubeError(
                self.refuse,
                "TooManyRequests",
                "Cannot evict pod as it would violate the pod's disruption budget.",
            )
        return {"status": "Success"}


def test_a_current_server_takes_policy_v1_with_the_grace_and_the_uid() -> None:
    server = Server("policy/v1", "policy/v1beta1")
    PodCalls(cast(KubeApi, server), "specon.io/managed=true").evict(JOB, POD, 29.5)
    (sent,) = server.sent
    assert sent["apiVersion"] == "policy/v1" and sent["kind"] == "Eviction"
    assert sent["deleteOptions"] == {"gracePeriodSeconds": 30, "preconditions": {"uid": "u1"}}


def test_a_server_older_than_1_22_is_asked_in_v1beta1_and_remembered() -> None:
    server = Server("policy/v1beta1")
    calls = PodCalls(cast(KubeApi, server), "specon.io/managed=true")
    calls.evict(JOB, POD, 10)
    calls.evict(JOB, POD, 10)
    assert [s["apiVersion"] for s in server.sent] == ["policy/v1", "policy/v1beta1", "policy/v1beta1"]


@pytest.mark.parametrize("served", ["policy/v1", "policy/v1beta1"])
def test_a_disruption_budget_refusal_is_a_failed_save_on_either_version(served: str) -> None:
    server = Server(served, refuse=429)
    with pytest.raises(SaveFailed, match=r"PodDisruptionBudget.*keeps running"):
        PodCalls(cast(KubeApi, server), "specon.io/managed=true").evict(JOB, POD, 10)
