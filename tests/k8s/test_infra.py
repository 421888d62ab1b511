"""The real-API-server test infrastructure itself: the control plane, the kubelet stand-in, RBAC."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest
from kubernetes import client

from tests.k8s.cluster import KubeCluster, present
from tests.k8s.kubelet import FakeKubelet, NodeSpec

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(120)]

T = TypeVar("T")


def eventually(probe: Callable[[], T | None], *, timeout: float = 30.0, what: str = "condition") -> T:
    """Poll ``probe`` until it returns something other than None/False."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value is not None and value is not False:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def python_pod(
    name: str,
    node: str,
    code: str,
    *,
    grace: int | None = None,
    volumes: list[client.V1Volume] | None = None,
    mounts: list[client.V1VolumeMount] | None = None,
    env: list[client.V1EnvVar] | None = None,
) -> client.V1Pod:
    container = client.V1Container(
        name="main", image="python:3.11", command=["python", "-c", code], volume_mounts=mounts, env=env
    )
    return client.V1Pod(
        metadata=client.V1ObjectMeta(name=name, labels={"app": "infra-test"}),
        spec=client.V1PodSpec(
            node_name=node,
            restart_policy="Never",
            termination_grace_period_seconds=grace,
            containers=[container],
            volumes=volumes,
        ),
    )


def exit_code(core: client.CoreV1Api, namespace: str, name: str) -> int:
    status = present(core.read_namespaced_pod_status(name, namespace).status)
    (only,) = present(status.container_statuses)
    return present(present(only.state).terminated).exit_code


def phase(core: client.CoreV1Api, namespace: str, name: str) -> str | None:
    try:
        status = core.read_namespaced_pod_status(name, namespace).status
    except client.ApiException as err:
        if err.status == 404:
            return "Gone"
        raise
    return status.phase if status else None


def test_api_server_answers_discovery(kube_api: client.ApiClient) -> None:
    version = client.VersionApi(kube_api).get_code()
    assert version.git_version == "v1.20.2"
    groups = {g.name for g in client.ApisApi(kube_api).get_api_versions().groups}
    assert {"apps", "rbac.authorization.k8s.io", "policy", "coordination.k8s.io"} <= groups
    core_resources = {r.name for r in client.CoreV1Api(kube_api).get_api_resources().resources}
    assert {"pods", "pods/eviction", "pods/status", "nodes", "namespaces"} <= core_resources


def test_kubelet_registers_ready_nodes(kube_api: client.ApiClient, fake_kubelet: FakeKubelet) -> None:
    nodes = client.CoreV1Api(kube_api).list_node(label_selector="specon.io/test-node=true").items
    assert sorted(present(n.metadata).name or "" for n in nodes) == ["node-1", "node-2", "node-3"]
    for node in nodes:
        status = present(node.status)
        ready = [c for c in status.conditions or [] if c.type == "Ready"]
        assert [c.status for c in ready] == ["True"]
        assert (status.allocatable or {}).get("cpu") == "4"
        assert not present(node.spec).unschedulable


def test_bound_pod_runs_as_a_local_process_and_succeeds(
    kube_api: client.ApiClient, kube_namespace: str, fake_kubelet: FakeKubelet, tmp_path: Path
) -> None:
    core = client.CoreV1Api(kube_api)
    out = tmp_path / "shared"
    out.mkdir()
    # The file's path goes through a hostPath mount (OUT=/data is rewritten) and the downward API.
    code = (
        "import os; e = os.environ; open(e['OUT'] + '/' + e['NODE'], 'w').write("
        "e['POD'] + ' ' + e['NS'] + ' ' + e['GREETING'])"
    )
    env = [
        client.V1EnvVar(name="GREETING", value="hello"),
        client.V1EnvVar(name="OUT", value="/data"),
        *(
            client.V1EnvVar(
                name=var,
                value_from=client.V1EnvVarSource(field_ref=client.V1ObjectFieldSelector(field_path=path)),
            )
            for var, path in (
                ("NODE", "spec.nodeName"),
                ("POD", "metadata.name"),
                ("NS", "metadata.namespace"),
            )
        ),
    ]
    pod = python_pod(
        "writer",
        "node-2",
        code,
        volumes=[client.V1Volume(name="data", host_path=client.V1HostPathVolumeSource(path=str(out)))],
        mounts=[client.V1VolumeMount(name="data", mount_path="/data")],
        env=env,
    )
    core.create_namespaced_pod(kube_namespace, pod)

    eventually(lambda: phase(core, kube_namespace, "writer") == "Succeeded", what="pod Succeeded")
    assert (out / "node-2").read_text() == f"writer {kube_namespace} hello"
    assert present(core.read_namespaced_pod_status("writer", kube_namespace).status).pod_ip == "127.0.0.2"
    assert exit_code(core, kube_namespace, "writer") == 0
    assert fake_kubelet.errors == []


def test_failing_pod_reports_exit_code(
    kube_api: client.ApiClient, kube_namespace: str, fake_kubelet: FakeKubelet
) -> None:
    core = client.CoreV1Api(kube_api)
    core.create_namespaced_pod(kube_namespace, python_pod("fails", "node-1", "import sys; sys.exit(7)"))
    eventually(lambda: phase(core, kube_namespace, "fails") == "Failed", what="pod Failed")
    assert exit_code(core, kube_namespace, "fails") == 7


def test_on_failure_restarts_until_the_process_succeeds(
    kube_api: client.ApiClient, kube_namespace: str, fake_kubelet: FakeKubelet
) -> None:
    core = client.CoreV1Api(kube_api)
    core.create_namespaced_config_map(
        kube_namespace,
        client.V1ConfigMap(metadata=client.V1ObjectMeta(name="settings"), data={"needed": "3"}),
    )
    # Each run leaves a file in an emptyDir (kept across restarts) and fails until there are enough.
    code = (
        "import os, sys; d = os.environ['STATE']; open(os.path.join(d, str(len(os.listdir(d)))), 'w')\n"
        "sys.exit(0 if len(os.listdir(d)) >= int(sys.argv[1]) else 1)"
    )
    pod = python_pod(
        "retry",
        "node-1",
        code,
        volumes=[client.V1Volume(name="state", empty_dir=client.V1EmptyDirVolumeSource())],
        mounts=[client.V1VolumeMount(name="state", mount_path="/state")],
        env=[
            client.V1EnvVar(name="STATE", value="/state"),
            client.V1EnvVar(
                name="NEEDED",
                value_from=client.V1EnvVarSource(
                    config_map_key_ref=client.V1ConfigMapKeySelector(name="settings", key="needed")
                ),
            ),
        ],
    )
    present(pod.spec).restart_policy = "OnFailure"
    present(present(pod.spec).containers[0].command).append("$(NEEDED)")
    core.create_namespaced_pod(kube_namespace, pod)

    eventually(lambda: phase(core, kube_namespace, "retry") == "Succeeded", what="pod Succeeded")
    status = present(core.read_namespaced_pod_status("retry", kube_namespace).status)
    assert [c.restart_count for c in present(status.container_statuses)] == [2]
    assert exit_code(core, kube_namespace, "retry") == 0


def test_pod_authenticates_as_its_service_account(
    kube_api: client.ApiClient, kube_namespace: str, fake_kubelet: FakeKubelet
) -> None:
    core = client.CoreV1Api(kube_api)
    core.create_namespaced_service_account(
        kube_namespace, client.V1ServiceAccount(metadata=client.V1ObjectMeta(name="runner"))
    )
    # config.load_config() finds the kubeconfig the stand-in wrote with the minted token.
    code = (
        "import os; from kubernetes import client, config; config.load_config()\n"
        "pod = client.CoreV1Api().read_namespaced_pod(os.environ['HOSTNAME'], os.environ['NS'])\n"
        "print('as', pod.spec.service_account_name)"
    )
    pod = python_pod(
        "client",
        "node-3",
        code,
        env=[
            client.V1EnvVar(
                name="NS",
                value_from=client.V1EnvVarSource(
                    field_ref=client.V1ObjectFieldSelector(field_path="metadata.namespace")
                ),
            )
        ],
    )
    present(pod.spec).service_account_name = "runner"
    core.create_namespaced_pod(kube_namespace, pod)

    eventually(lambda: phase(core, kube_namespace, "client") in ("Succeeded", "Failed"), what="pod done")
    assert "as runner" in fake_kubelet.log(kube_namespace, "client")
    token_dir = present(fake_kubelet.pod_dir(kube_namespace, "client")) / "serviceaccount"
    assert (token_dir / "namespace").read_text() == kube_namespace


def test_graceful_deletion_delivers_sigterm_then_removes_the_pod(
    kube_api: client.ApiClient, kube_namespace: str, fake_kubelet: FakeKubelet, tmp_path: Path
) -> None:
    core = client.CoreV1Api(kube_api)
    marker = tmp_path / "got-sigterm"
    code = (
        "import signal, sys, time\n"
        f"def on_term(*_):\n    open({str(marker)!r}, 'w').write('TERM'); sys.exit(0)\n"
        "signal.signal(signal.SIGTERM, on_term)\n"
        "print('ready', flush=True)\n"
        "while True: time.sleep(0.05)\n"
    )
    core.create_namespaced_pod(kube_namespace, python_pod("sleeper", "node-3", code, grace=30))
    eventually(lambda: phase(core, kube_namespace, "sleeper") == "Running", what="pod Running")
    eventually(lambda: "ready" in fake_kubelet.log(kube_namespace, "sleeper"), what="handler installed")
    pid = fake_kubelet.pid(kube_namespace, "sleeper")
    assert pid is not None

    core.delete_namespaced_pod("sleeper", kube_namespace)  # default grace: the pod's 30 s

    eventually(lambda: phase(core, kube_namespace, "sleeper") == "Gone", what="pod deleted")
    assert marker.read_text() == "TERM"
    assert not _alive(pid)
    assert fake_kubelet.errors == []


def test_stubborn_process_is_killed_after_the_grace_period(
    kube_api: client.ApiClient, kube_namespace: str, fake_kubelet: FakeKubelet
) -> None:
    core = client.CoreV1Api(kube_api)
    code = (
        "import signal, time\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "print('ready', flush=True)\n"
        "time.sleep(600)"
    )
    core.create_namespaced_pod(kube_namespace, python_pod("stubborn", "node-1", code))
    eventually(lambda: "ready" in fake_kubelet.log(kube_namespace, "stubborn"), what="SIGTERM ignored")
    pid = fake_kubelet.pid(kube_namespace, "stubborn")
    assert pid is not None

    core.delete_namespaced_pod("stubborn", kube_namespace, grace_period_seconds=1)

    eventually(lambda: phase(core, kube_namespace, "stubborn") == "Gone", what="pod deleted")
    assert not _alive(pid)


def test_stop_kills_every_process(kube_cluster: KubeCluster, kube_namespace: str, tmp_path: Path) -> None:
    core = client.CoreV1Api(kube_cluster.api_client())
    with FakeKubelet(kube_cluster, [NodeSpec("stop-node")], workdir=tmp_path) as kubelet:
        core.create_namespaced_pod(
            kube_namespace, python_pod("forever", "stop-node", "import time; time.sleep(600)")
        )
        pid = eventually(lambda: kubelet.pid(kube_namespace, "forever"), what="process started")
    assert not _alive(pid)
    assert all(present(n.metadata).name != "stop-node" for n in core.list_node().items)


def test_rbac_denies_a_service_account_until_a_role_binding_allows_it(
    kube_rbac_cluster: KubeCluster, kube_rbac_namespace: str
) -> None:
    ns = kube_rbac_namespace
    admin = client.CoreV1Api(kube_rbac_cluster.api_client())
    admin.create_namespaced_service_account(
        ns, client.V1ServiceAccount(metadata=client.V1ObjectMeta(name="reader"))
    )
    token = kube_rbac_cluster.service_account_token(ns, "reader")
    as_reader = client.CoreV1Api(kube_rbac_cluster.api_client(token))

    with pytest.raises(client.ApiException) as denied:
        as_reader.list_namespaced_pod(ns)
    assert denied.value.status == 403
    assert f"system:serviceaccount:{ns}:reader" in str(denied.value.body)

    rbac = client.RbacAuthorizationV1Api(kube_rbac_cluster.api_client())
    rbac.create_namespaced_role(
        ns,
        client.V1Role(
            metadata=client.V1ObjectMeta(name="pod-reader"),
            rules=[client.V1PolicyRule(api_groups=[""], resources=["pods"], verbs=["get", "list"])],
        ),
    )
    rbac.create_namespaced_role_binding(
        ns,
        client.V1RoleBinding(
            metadata=client.V1ObjectMeta(name="reader-reads-pods"),
            role_ref=client.V1RoleRef(api_group="rbac.authorization.k8s.io", kind="Role", name="pod-reader"),
            subjects=[client.RbacV1Subject(kind="ServiceAccount", name="reader", namespace=ns)],
        ),
    )

    assert eventually(lambda: _allowed(lambda: as_reader.list_namespaced_pod(ns)), what="RBAC to apply")
    with pytest.raises(client.ApiException) as still_denied:  # only what the Role grants
        as_reader.delete_collection_namespaced_pod(ns)
    assert still_denied.value.status == 403


def _allowed(call: Callable[[], object]) -> bool:
    try:
        call()
    except client.ApiException as err:
        if err.status == 403:
            return False
        raise
    return True


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is dead for our purposes; the kubelet reaps its children.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False
