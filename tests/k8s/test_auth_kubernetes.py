"""Per-agent identity on Kubernetes, against a real kube-apiserver: an agent authenticates with
its pod's projected ServiceAccount token, the manager checks it with a TokenReview and binds
it to the node the pod runs on (manager/auth_kubernetes.py).

The tokens are minted exactly as a kubelet mints them for a projected ``serviceAccountToken``
volume (TokenRequest bound to the pod, with the manager's audience); the last test mounts the
agent DaemonSet's own projection through the kubelet stand-in."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from specon_manager.auth import Identity
from specon_manager.auth_kubernetes import TokenReviewAuthenticator

from specon.model import WorkerId
from specon.runtime.kubernetes.api import KubeApi, KubeError
from tests.k8s.cluster import SA_ISSUER, KubeCluster
from tests.k8s.kubelet import FakeKubelet
from tests.k8s.test_runtime_kubernetes import until

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(120)]

AUD = "specon-manager"
AGENT = "specon-agent"
MANIFESTS = Path(__file__).resolve().parents[2] / "manifests"


def account(api: KubeApi, namespace: str, name: str) -> None:
    body = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name}}
    with contextlib.suppress(KubeError):  # already there
        api.request("POST", f"/api/v1/namespaces/{namespace}/serviceaccounts", body=body)


def agent_pod(
    name: str, node: str, *, sa: str = AGENT, volumes: Any = None, cmd: Any = None
) -> dict[str, Any]:
    container: dict[str, Any] = {
        "name": "agent",
        "image": "specon:0.1.0",
        "command": cmd or ["python", "-c", "import time; time.sleep(3600)"],
    }
    spec: dict[str, Any] = {
        "nodeName": node,
        "serviceAccountName": sa,
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": 1,
        "containers": [container],
    }
    if volumes:
        spec["volumes"], container["volumeMounts"] = volumes
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


@pytest.fixture
def admin(kube_cluster: KubeCluster) -> KubeApi:
    return KubeApi(kube_cluster.api_client())


@pytest.fixture
def agents(admin: KubeApi, kube_namespace: str) -> Iterator[str]:
    """The agents' namespace: their ServiceAccount, an intruder's, and agent pods on node-a and
    node-b (objects only: nothing runs them, and nothing needs to)."""
    ns = kube_namespace
    account(admin, ns, AGENT)
    account(admin, ns, "intruder")
    for name, node, sa in (
        ("agent-a", "node-a", AGENT),
        ("agent-b", "node-b", AGENT),
        ("evil", "node-a", "intruder"),
    ):
        admin.request("POST", f"/api/v1/namespaces/{ns}/pods", body=agent_pod(name, node, sa=sa))
    yield ns


def authenticator(admin: KubeApi, ns: str) -> TokenReviewAuthenticator:
    return TokenReviewAuthenticator(admin, audience=AUD, service_account=f"{ns}/{AGENT}")


async def test_an_agent_pods_token_speaks_for_its_own_node_only(
    kube_cluster: KubeCluster, admin: KubeApi, agents: str
) -> None:
    auth = authenticator(admin, agents)
    token_a = kube_cluster.pod_token(agents, "agent-a", audience=AUD)
    token_b = kube_cluster.pod_token(agents, "agent-b", audience=AUD)
    a, b = await auth.authenticate(token_a), await auth.authenticate(token_b)
    assert a == Identity(name="agent:node-a", worker=WorkerId("node-a"))
    assert b == Identity(name="agent:node-b", worker=WorkerId("node-b"))
    assert a.may_speak_for("node-a") and not a.may_speak_for("node-b")
    assert not b.may_speak_for("node-a")
    assert await auth.authenticate(token_a) == a and auth.reviews == 2  # cached


async def test_the_token_of_another_service_account_is_refused(
    kube_cluster: KubeCluster, admin: KubeApi, agents: str
) -> None:
    auth = authenticator(admin, agents)
    # A pod of another account on node-a, its token minted for the manager's audience.
    assert await auth.authenticate(kube_cluster.pod_token(agents, "evil", audience=AUD)) is None
    # The same account name in another namespace is another account.
    with kube_cluster.temporary_namespace("elsewhere") as other:
        account(admin, other, AGENT)
        admin.request("POST", f"/api/v1/namespaces/{other}/pods", body=agent_pod("agent-a", "node-a"))
        assert await auth.authenticate(kube_cluster.pod_token(other, "agent-a", audience=AUD)) is None
    # The API server's own token of the agent (its default audience) is not for the manager,
    # and a token bound to no pod (as a legacy Secret token) speaks for no node.
    assert await auth.authenticate(kube_cluster.service_account_token(agents, AGENT)) is None
    unbound = client.CoreV1Api(kube_cluster.api_client()).create_namespaced_service_account_token(
        AGENT,
        agents,
        client.AuthenticationV1TokenRequest(spec=client.V1TokenRequestSpec(audiences=[AUD])),
    )
    assert unbound.status is not None
    assert await auth.authenticate(unbound.status.token) is None


async def test_a_token_for_a_pod_on_node_a_never_speaks_for_node_b(
    kube_cluster: KubeCluster, admin: KubeApi, agents: str
) -> None:
    token_a = kube_cluster.pod_token(agents, "agent-a", audience=AUD)
    assert (await authenticator(admin, agents).authenticate(token_a)) == Identity(
        "agent:node-a", WorkerId("node-a")
    )
    # The pod goes; one of the same name comes back on node-b. The old token is dead: it was
    # bound to the first pod's uid, and never names the new pod's node.
    path = f"/api/v1/namespaces/{agents}/pods/agent-a"
    admin.request("DELETE", path, body={"gracePeriodSeconds": 0})
    await until(lambda: _gone(admin, path), "agent-a to be gone")
    admin.request("POST", f"/api/v1/namespaces/{agents}/pods", body=agent_pod("agent-a", "node-b"))
    assert await authenticator(admin, agents).authenticate(token_a) is None
    fresh = kube_cluster.pod_token(agents, "agent-a", audience=AUD)
    assert (await authenticator(admin, agents).authenticate(fresh)) == Identity(
        "agent:node-b", WorkerId("node-b")
    )


def _gone(api: KubeApi, path: str) -> bool:
    try:
        api.request("GET", path)
    except KubeError as exc:
        return exc.status == 404
    return False


async def test_reviews_run_off_the_event_loop(
    kube_cluster: KubeCluster, admin: KubeApi, agents: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    auth = authenticator(admin, agents)
    tokens = [
        kube_cluster.pod_token(agents, "agent-a", audience=AUD, expiration_seconds=600 + i) for i in range(8)
    ]
    # Which thread makes each API call: never the event loop's. (Counting the loop's ticks
    # during the reviews could fail by chance: 8 quick reviews may all end within one tick.)
    loop_thread = threading.get_ident()
    callers: list[int] = []
    real_request = admin.request

    def request(*args: Any, **kw: Any) -> Any:
        callers.append(threading.get_ident())
        return real_request(*args, **kw)

    monkeypatch.setattr(admin, "request", request)
    found = await asyncio.gather(*(auth.authenticate(t) for t in tokens))
    assert {f.worker for f in found if f is not None} == {"node-a"} and len(found) == 8
    assert auth.reviews == 8
    assert len(callers) >= 8 and loop_thread not in callers


async def test_the_daemonsets_projected_token_authenticates_as_the_pods_node(
    kube_cluster: KubeCluster, admin: KubeApi, kube_namespace: str, fake_kubelet: FakeKubelet, tmp_path: Path
) -> None:
    """The agent DaemonSet's token volume, as shipped, mounted by the kubelet stand-in on
    node-2: what the agent would read there authenticates as node-2."""
    from tests.k8s.test_manifests import by_kind, render  # noqa: PLC0415  (kubectl needed only here)

    (daemonset,) = by_kind(render(MANIFESTS))["DaemonSet"]
    template = daemonset["spec"]["template"]["spec"]
    (mount,) = [m for m in template["containers"][0]["volumeMounts"] if m["name"] == "manager-token"]
    (volume,) = [v for v in template["volumes"] if v["name"] == "manager-token"]
    args = template["containers"][0]["args"]
    token_file = next(a.split("=", 1)[1] for a in args if a.startswith("--token-file="))
    assert token_file.startswith(mount["mountPath"] + "/")
    account(admin, kube_namespace, AGENT)
    out = tmp_path / "seen-token"
    copy = ["python", "-c", "import shutil, sys; shutil.copy(sys.argv[1], sys.argv[2])", token_file, str(out)]
    pod = agent_pod("agent-x", "node-2", volumes=([volume], [mount]), cmd=copy)
    admin.request("POST", f"/api/v1/namespaces/{kube_namespace}/pods", body=pod)
    token = await until(lambda: out.exists() and out.read_text(), "the pod to read its projected token")
    auth = authenticator(admin, kube_namespace)
    assert await auth.authenticate(token) == Identity("agent:node-2", WorkerId("node-2"))
    # Minted for the manager only: the API server itself does not accept it.
    with pytest.raises(KubeError) as err:
        KubeApi(kube_cluster.api_client(token)).request("GET", f"/api/v1/namespaces/{kube_namespace}/pods")
    assert err.value.status == 401
    assert SA_ISSUER not in volume["projected"]["sources"][0]["serviceAccountToken"]["audience"]
